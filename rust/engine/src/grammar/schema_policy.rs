//! What rsgl does with JSON-schema keywords llguidance cannot enforce, before compiling.
//!
//! llguidance enforces types, `properties`/`required`/`additionalProperties`/`patternProperties`,
//! `items`/`prefixItems`/`minItems`/`maxItems`, string lengths, `pattern`, its own `format`s,
//! number bounds, `multipleOf`, `enum`/`const`, `anyOf`/`allOf` and `$ref`. Everything else in
//! real schemas is either rewritten exactly (a `oneOf` whose branches cannot overlap is an
//! `anyOf`), dropped because it constrains nothing, or relaxed: dropped or approximated, so the
//! grammar accepts more than the schema. Each relaxation is returned, so it can be reported to
//! the user, or refused in strict mode.
//!
//! llguidance also cannot intersect two schemas through a `$ref` it is still compiling (a
//! recursive one): a keyword beside `anyOf` meets every branch, a named property the schema of
//! the `patternProperties` key it matches. What such a keyword or property schema says that is
//! implied anyway goes; the rest is relaxed where it leads to recursion.

use crate::error::{invalid, Result};
use regex::Regex;
use serde::Serialize;
use serde_json::{Map, Value};
use std::collections::{HashMap, HashSet};

/// The formats llguidance compiles to a regular expression (its `json::formats::lookup_format`).
const KNOWN_FORMATS: [&str; 11] = ["date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid", "uri", "unknown"];

/// Keywords whose check needs look-ahead a grammar cannot do; dropped, with what that means.
const DROPPED: [(&str, &str); 14] = [
    ("not", "dropped: values it excludes are not prevented"),
    ("if", "dropped with then/else: the conditional branches are not enforced"),
    ("then", "dropped: the conditional branch is not enforced"),
    ("else", "dropped: the conditional branch is not enforced"),
    ("dependencies", "dropped: properties it makes depend on others are not enforced"),
    ("dependentRequired", "dropped: properties it makes depend on others are not enforced"),
    ("dependentSchemas", "dropped: properties it makes depend on others are not enforced"),
    ("propertyNames", "dropped: property names are not checked against it"),
    ("contains", "dropped: no item is required to match it"),
    ("minContains", "dropped with contains"),
    ("maxContains", "dropped with contains"),
    ("unevaluatedProperties", "dropped: properties not named by the schema are allowed"),
    ("unevaluatedItems", "dropped: items not described by the schema are allowed"),
    ("uniqueItems", "dropped: items may repeat"),
];

/// Annotations llguidance would refuse as unimplemented; they constrain nothing.
const ANNOTATIONS: [&str; 5] = ["$recursiveAnchor", "$dynamicAnchor", "$vocabulary", "contentSchema", "deprecated"];

/// Before draft 2019-09, keywords beside `$ref` are ignored; llguidance would apply them (and
/// refuses them on recursive references). Definitions stay: references may point into them.
const KEPT_BESIDE_REF: [&str; 5] = ["$ref", "definitions", "$defs", "$schema", "x-guidance"];

/// Regular-expression syntax a grammar cannot express: look-around and word boundaries.
const LOOK_AROUND: [&str; 6] = ["(?=", "(?!", "(?<=", "(?<!", "\\b", "\\B"];

/// Keywords holding a schema that may allow anything.
const ALLOWING_ANYTHING: [&str; 3] = ["additionalProperties", "items", "additionalItems"];

/// Keywords that describe a schema without constraining its values.
const DESCRIPTIVE: [&str; 7] = ["title", "description", "default", "examples", "$comment", "readOnly", "writeOnly"];

/// One keyword of the schema the grammar does not enforce exactly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Relaxation {
    pub keyword: String,
    /// JSON pointer (RFC 6901) to the schema object holding the keyword.
    pub pointer: String,
    pub action: String,
}

impl std::fmt::Display for Relaxation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let at = if self.pointer.is_empty() { "the root" } else { &self.pointer };
        write!(f, "`{}` at {at}: {}", self.keyword, self.action)
    }
}

/// Strict mode: a schema the grammar would relax is refused, naming what to change.
pub fn refuse_relaxed(relaxations: &[Relaxation]) -> Result<()> {
    if relaxations.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = relaxations.iter().map(Relaxation::to_string).collect();
    Err(invalid(format!(
        "json_schema: strict mode refuses what the grammar cannot enforce exactly: {}. Remove these keywords, or send \
         the request without strict_json_schema to accept the schema with them relaxed",
        listed.join("; ")
    )))
}

/// The relaxations `relax` makes to the schema in `text`.
pub fn relaxations_of(text: &str) -> Result<Vec<Relaxation>> {
    relaxed_schema(text).map(|(_, relaxations)| relaxations)
}

/// The schema in `text` as `relax` rewrites it, and the relaxations made.
pub fn relaxed_schema(text: &str) -> Result<(Value, Vec<Relaxation>)> {
    let mut schema: Value = serde_json::from_str(text).map_err(|e| invalid(format!("json_schema: not valid JSON: {e}")))?;
    let relaxations = relax(&mut schema);
    Ok((schema, relaxations))
}

/// Rewrites `schema` into one llguidance compiles, returning every relaxation made.
pub fn relax(schema: &mut Value) -> Vec<Relaxation> {
    let root = schema.clone();
    let draft = root.get("$schema").and_then(Value::as_str).unwrap_or_default();
    let ref_siblings_ignored = ["draft-03", "draft-04", "draft-06", "draft-07"].iter().any(|d| draft.contains(d));
    let mut refs = Vec::new();
    collect_local_refs(&root, &mut refs);
    let leading_to_recursion = targets_leading_to_recursion(&root, &refs);
    let mut walk = Walk { root: &root, refs, leading_to_recursion, ref_siblings_ignored, relaxations: Vec::new() };
    walk.schema(schema, String::new());
    walk.relaxations
}

struct Walk<'a> {
    /// The original schema, for resolving local `$ref`s.
    root: &'a Value,
    /// The JSON pointers of the schema's local `$ref`s.
    refs: Vec<String>,
    /// The targets of `refs` from which references lead back into a reference already followed.
    leading_to_recursion: HashSet<String>,
    /// The schema's draft ignores keywords beside `$ref`.
    ref_siblings_ignored: bool,
    relaxations: Vec<Relaxation>,
}

impl Walk<'_> {
    fn schema(&mut self, schema: &mut Value, pointer: String) {
        let Some(object) = schema.as_object_mut() else { return };
        self.keywords(object, &pointer);
        for (keyword, sub) in object.iter_mut() {
            let here = format!("{pointer}/{}", escape(keyword));
            match (keyword.as_str(), sub) {
                ("properties" | "patternProperties" | "$defs" | "definitions", Value::Object(map)) => {
                    for (name, sub) in map.iter_mut() {
                        self.schema(sub, format!("{here}/{}", escape(name)));
                    }
                }
                ("anyOf" | "allOf" | "prefixItems" | "items", Value::Array(list)) => {
                    for (i, sub) in list.iter_mut().enumerate() {
                        self.schema(sub, format!("{here}/{i}"));
                    }
                }
                ("additionalProperties" | "additionalItems" | "items", sub) => self.schema(sub, here),
                // Other keywords hold data, or schemas only where a `$ref` points (`components`...).
                (_, sub @ Value::Object(_)) if self.referenced(&here) => self.schema(sub, here),
                _ => {}
            }
        }
    }

    /// Applies the policy to the keywords of one schema object.
    fn keywords(&mut self, object: &mut Map<String, Value>, pointer: &str) {
        for keyword in ANNOTATIONS {
            object.remove(keyword);
        }
        if self.ref_siblings_ignored && object.contains_key("$ref") {
            object.retain(|keyword, _| KEPT_BESIDE_REF.contains(&keyword.as_str()));
        }
        if object.get("pattern").and_then(Value::as_str).is_some_and(has_look_around) {
            object.remove("pattern");
            self.relaxed("pattern", pointer, "dropped: look-around and \\b cannot be expressed by a grammar");
        }
        if let Some(branches) = object.remove("oneOf") {
            if !self.disjoint(&branches) {
                self.relaxed("oneOf", pointer, "approximated as anyOf: an output may match more than one branch");
            }
            // `oneOf` and `anyOf` side by side must both hold: the second goes under `allOf`.
            match object.remove("anyOf") {
                Some(any_of) => push_all_of(object, [serde_json::json!({"anyOf": any_of}), serde_json::json!({"anyOf": branches})]),
                None => {
                    object.insert("anyOf".into(), branches);
                }
            }
        }
        self.drop_type_implied_by_branches(object);
        // llguidance intersects a keyword beside `anyOf` with each branch: one allowing anything
        // needs no intersection, and cannot make one through a recursive reference fail.
        object.retain(|keyword, value| !(ALLOWING_ANYTHING.contains(&keyword.as_str()) && allows_anything(value)));
        self.look_around_pattern_keys(object, pointer);
        self.named_properties_under_patterns(object, pointer);
        if object.get("format").and_then(Value::as_str).is_some_and(|f| !KNOWN_FORMATS.contains(&f)) {
            object.remove("format");
            // A format constrains strings only: on other types (OpenAPI's `int32`...) it is an annotation.
            if types(object).is_none_or(|t| t.contains(&"string")) {
                self.relaxed("format", pointer, "unknown format dropped: any string is allowed");
            }
        }
        if exact_without_unique_items(object) {
            object.remove("uniqueItems");
        }
        self.object_size(object, pointer);
        for (keyword, action) in DROPPED {
            if object.remove(keyword).is_some() {
                self.relaxed(keyword, pointer, action);
            }
        }
    }

    /// A `type` beside `anyOf` that every branch already narrows to goes: llguidance would
    /// intersect it with each branch, which fails through a recursive reference.
    fn drop_type_implied_by_branches(&self, object: &mut Map<String, Value>) {
        let (Some(outer), Some(Value::Array(branches))) = (declared_types(object), object.get("anyOf")) else { return };
        let within = |t: &str| outer.contains(&t) || (t == "integer" && outer.contains(&"number"));
        if branches.iter().all(|b| self.resolve(b).as_object().and_then(types).is_some_and(|narrowed| narrowed.into_iter().all(within))) {
            object.remove("type");
        }
    }

    /// A `patternProperties` key with look-around cannot be compiled: its schema goes to
    /// `additionalProperties` (beside what that allowed), so it applies to every property not
    /// named or matched by another pattern, including those the look-around excluded.
    fn look_around_pattern_keys(&mut self, object: &mut Map<String, Value>, pointer: &str) {
        let Some(Value::Object(patterns)) = object.get_mut("patternProperties") else { return };
        let keys: Vec<String> = patterns.keys().filter(|key| has_look_around(key)).cloned().collect();
        if keys.is_empty() {
            return;
        }
        let mut widened: Vec<Value> = keys.iter().filter_map(|key| patterns.remove(key)).collect();
        if patterns.is_empty() {
            object.remove("patternProperties");
        }
        for key in &keys {
            self.relaxed("patternProperties", pointer, &format!("key `{key}` has look-around: its schema applies to every property not named"));
        }
        // Absent or true, additionalProperties already allows what the key's schema would.
        match object.remove("additionalProperties") {
            None | Some(Value::Bool(true)) => return,
            Some(Value::Bool(false)) => {}
            Some(additional) => widened.push(additional),
        }
        let schema = if widened.len() == 1 { widened.remove(0) } else { serde_json::json!({ "anyOf": widened }) };
        object.insert("additionalProperties".into(), schema);
    }

    /// A named property matching a `patternProperties` key must satisfy both schemas, which
    /// llguidance intersects; it cannot through a reference it is still compiling. The
    /// property's own schema goes when it says nothing more than the pattern's, and is relaxed
    /// when either leads to recursion.
    fn named_properties_under_patterns(&mut self, object: &mut Map<String, Value>, pointer: &str) {
        let Some(Value::Object(patterns)) = object.get("patternProperties") else { return };
        let patterns: Vec<(Regex, Value)> = patterns.iter().filter_map(|(key, schema)| Some((Regex::new(key).ok()?, schema.clone()))).collect();
        let Some(Value::Object(properties)) = object.get_mut("properties") else { return };
        for (name, schema) in properties.iter_mut() {
            let here = format!("{pointer}/properties/{}", escape(name));
            let Some((_, pattern_schema)) = patterns.iter().find(|(key, _)| key.is_match(name)) else { continue };
            if self.referenced(&here) {
                continue;
            }
            if constraints(schema) == constraints(pattern_schema) {
                *schema = Value::Object(Map::new());
            } else if self.leads_to_recursion(schema) || self.leads_to_recursion(pattern_schema) {
                *schema = Value::Object(Map::new());
                self.relaxed(
                    "properties",
                    &here,
                    "dropped: the property is checked against the schema of the patternProperties key it matches only (llguidance \
                     cannot intersect the two through recursive references)",
                );
            }
        }
    }

    /// Whether a local `$ref` in `schema` leads to recursion.
    fn leads_to_recursion(&self, schema: &Value) -> bool {
        let mut refs = Vec::new();
        collect_local_refs(schema, &mut refs);
        refs.iter().any(|r| self.leading_to_recursion.contains(r))
    }

    /// `minProperties` / `maxProperties`: dropped when `required` and closed `properties` already
    /// imply them, kept where llguidance enforces them (at most one optional property more,
    /// nothing but the listed properties), relaxed otherwise.
    fn object_size(&mut self, object: &mut Map<String, Value>, pointer: &str) {
        let (min, max) = (object.get("minProperties").and_then(Value::as_u64), object.get("maxProperties").and_then(Value::as_u64));
        if min.is_none() && max.is_none() {
            return;
        }
        let required = object.get("required").and_then(Value::as_array).map_or(0, Vec::len) as u64;
        let closed = object.get("additionalProperties") == Some(&Value::Bool(false)) && !object.contains_key("patternProperties");
        let listed = object.get("properties").and_then(Value::as_object).map_or(0, Map::len) as u64;
        let min_implied = min.is_none_or(|m| m <= required);
        let max_implied = max.is_none_or(|m| closed && listed <= m);
        let llguidance_enforces = closed && min.is_none_or(|m| m <= required + 1) && max.is_none_or(|m| m == required + 1);
        if min_implied && max_implied {
            object.remove("minProperties");
            object.remove("maxProperties");
        } else if !llguidance_enforces {
            for keyword in ["minProperties", "maxProperties"] {
                if object.remove(keyword).is_some() {
                    self.relaxed(keyword, pointer, "dropped: the number of properties is not enforced");
                }
            }
        }
    }

    /// Whether no value can match two of `branches`: each branch allows only types, or only
    /// literal values, or only values of a required discriminating property, the others do not.
    fn disjoint(&self, branches: &Value) -> bool {
        let Some(branches) = branches.as_array() else { return true };
        let resolved: Vec<&Value> = branches.iter().map(|b| self.resolve(b)).collect();
        let pairs = resolved.iter().enumerate().flat_map(|(i, a)| resolved[i + 1..].iter().map(move |b| (*a, *b)));
        pairs.into_iter().all(|(a, b)| types_disjoint(a, b) || literals_disjoint(a, b) || discriminated(a, b))
    }

    /// Whether a local `$ref` points at or into `pointer`.
    fn referenced(&self, pointer: &str) -> bool {
        self.refs.iter().any(|r| r.strip_prefix(pointer).is_some_and(|rest| rest.is_empty() || rest.starts_with('/')))
    }

    /// The schema a local `$ref` points to (the branch itself otherwise).
    fn resolve<'v>(&'v self, branch: &'v Value) -> &'v Value {
        let target = branch.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')).and_then(|p| self.root.pointer(p));
        target.unwrap_or(branch)
    }

    fn relaxed(&mut self, keyword: &str, pointer: &str, action: &str) {
        self.relaxations.push(Relaxation { keyword: keyword.into(), pointer: pointer.into(), action: action.into() });
    }
}

fn collect_local_refs(value: &Value, refs: &mut Vec<String>) {
    match value {
        Value::Object(object) => {
            if let Some(pointer) = object.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix('#')) {
                refs.push(pointer.to_string());
            }
            object.values().for_each(|v| collect_local_refs(v, refs));
        }
        Value::Array(list) => list.iter().for_each(|v| collect_local_refs(v, refs)),
        _ => {}
    }
}

/// The local `$ref` targets from which following references comes back to one already followed.
fn targets_leading_to_recursion(root: &Value, refs: &[String]) -> HashSet<String> {
    let targets: HashSet<&String> = refs.iter().collect();
    let edges: HashMap<&String, Vec<String>> = targets
        .iter()
        .map(|&target| {
            let mut inner = Vec::new();
            if let Some(schema) = root.pointer(target) {
                collect_local_refs(schema, &mut inner);
            }
            (target, inner)
        })
        .collect();
    let reachable_from = |start: &String| -> HashSet<&String> {
        let mut seen = HashSet::new();
        let mut stack: Vec<&String> = edges.get(start).into_iter().flatten().collect();
        while let Some(next) = stack.pop() {
            if seen.insert(next) {
                stack.extend(edges.get(next).into_iter().flatten());
            }
        }
        seen
    };
    let reachable: HashMap<&String, HashSet<&String>> = targets.iter().map(|&t| (t, reachable_from(t))).collect();
    let recursive: HashSet<&String> = targets.iter().copied().filter(|t| reachable[t].contains(t)).collect();
    targets.into_iter().filter(|t| recursive.contains(t) || reachable[t].iter().any(|r| recursive.contains(r))).cloned().collect()
}

fn allows_anything(schema: &Value) -> bool {
    schema == &Value::Bool(true) || schema.as_object().is_some_and(Map::is_empty)
}

/// What a schema constrains: the schema without its descriptive keywords.
fn constraints(schema: &Value) -> Value {
    match schema {
        Value::Object(object) => {
            Value::Object(object.iter().filter(|(k, _)| !DESCRIPTIVE.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone())).collect())
        }
        other => other.clone(),
    }
}

fn has_look_around(pattern: &str) -> bool {
    LOOK_AROUND.iter().any(|l| pattern.contains(l))
}

fn push_all_of(object: &mut Map<String, Value>, schemas: [Value; 2]) {
    let all_of = object.entry("allOf").or_insert_with(|| Value::Array(Vec::new()));
    if let Value::Array(list) = all_of {
        list.extend(schemas);
    }
}

/// `uniqueItems` that cannot fail: false, or arrays of at most one item.
fn exact_without_unique_items(object: &Map<String, Value>) -> bool {
    match object.get("uniqueItems") {
        Some(Value::Bool(true)) => object.get("maxItems").and_then(Value::as_u64).is_some_and(|m| m <= 1),
        Some(_) => true,
        None => false,
    }
}

/// The JSON types a schema allows, when it says (`type`, or the types of its literal values).
fn types(schema: &Map<String, Value>) -> Option<Vec<&'static str>> {
    match literals(schema) {
        Some(literals) => Some(literals.iter().map(type_of).collect()),
        None => declared_types(schema),
    }
}

/// The types named by the schema's `type`.
fn declared_types(schema: &Map<String, Value>) -> Option<Vec<&'static str>> {
    let name = |t: &str| ["null", "boolean", "object", "array", "number", "string", "integer"].into_iter().find(|n| *n == t);
    match schema.get("type")? {
        Value::String(t) => Some(vec![name(t)?]),
        Value::Array(list) => list.iter().map(|t| t.as_str().and_then(name)).collect(),
        _ => None,
    }
}

fn type_of(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn types_disjoint(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object().and_then(types), b.as_object().and_then(types)) else { return false };
    let overlap = |x: &str, y: &str| x == y || matches!((x, y), ("integer", "number") | ("number", "integer"));
    !a.iter().any(|x| b.iter().any(|y| overlap(x, y)))
}

/// The values a schema allows, when it lists them (`const` or `enum`).
fn literals(schema: &Map<String, Value>) -> Option<Vec<Value>> {
    match (schema.get("const"), schema.get("enum")) {
        (Some(value), _) => Some(vec![value.clone()]),
        (None, Some(Value::Array(values))) => Some(values.clone()),
        _ => None,
    }
}

fn literals_disjoint(a: &Value, b: &Value) -> bool {
    let (Some(a), Some(b)) = (a.as_object().and_then(literals), b.as_object().and_then(literals)) else { return false };
    !a.iter().any(|x| b.contains(x))
}

/// Objects told apart by a property both require, with literal values no value of which is shared.
fn discriminated(a: &Value, b: &Value) -> bool {
    let required = |s: &Value| -> Vec<String> {
        s.get("required").and_then(Value::as_array).map(|r| r.iter().filter_map(|n| n.as_str().map(String::from)).collect()).unwrap_or_default()
    };
    let property = |s: &Value, name: &str| s.get("properties").and_then(|p| p.get(name)).cloned().unwrap_or(Value::Bool(true));
    let b_required = required(b);
    required(a).iter().filter(|name| b_required.contains(name)).any(|name| literals_disjoint(&property(a, name), &property(b, name)))
}

/// A JSON pointer token (RFC 6901).
fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests;
