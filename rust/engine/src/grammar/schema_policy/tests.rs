use super::*;
use serde_json::json;

/// The relaxed schema and the keyword/pointer of each relaxation.
fn relaxed(mut schema: Value) -> (Value, Vec<(String, String)>) {
    let relaxations = relax(&mut schema);
    (schema, relaxations.into_iter().map(|r| (r.keyword, r.pointer)).collect())
}

fn one(keyword: &str, pointer: &str) -> Vec<(String, String)> {
    vec![(keyword.to_string(), pointer.to_string())]
}

fn strict(schema: Value) -> Result<()> {
    refuse_relaxed(&relaxations_of(&schema.to_string())?)
}

#[test]
fn enforced_keywords_pass_unchanged() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "string", "format": "date-time", "maxLength": 30}},
        "required": ["a"], "additionalProperties": false, "$defs": {"x": {"anyOf": [{"type": "null"}]}}});
    assert_eq!(relaxed(schema.clone()), (schema.clone(), vec![]));
    assert!(strict(schema).is_ok());
}

#[test]
fn one_of_with_disjoint_types_becomes_any_of_exactly() {
    let (schema, relaxations) = relaxed(json!({"oneOf": [{"type": "string"}, {"type": "integer"}, {"const": null}]}));
    assert_eq!(schema, json!({"anyOf": [{"type": "string"}, {"type": "integer"}, {"const": null}]}));
    assert!(relaxations.is_empty());
}

#[test]
fn one_of_with_discriminator_through_refs_is_exact() {
    let schema = json!({"oneOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}], "$defs": {
        "a": {"type": "object", "properties": {"kind": {"const": "a"}}, "required": ["kind"]},
        "b": {"type": "object", "properties": {"kind": {"enum": ["b", "c"]}}, "required": ["kind"]}}});
    assert!(relaxed(schema.clone()).1.is_empty());
    assert!(strict(schema).is_ok());
}

#[test]
fn overlapping_one_of_is_approximated_and_refused_in_strict_mode() {
    let schema = json!({"properties": {"n": {"oneOf": [{"type": "number"}, {"type": "integer"}]}}});
    let (relaxed_schema, relaxations) = relaxed(schema.clone());
    assert_eq!(relaxed_schema, json!({"properties": {"n": {"anyOf": [{"type": "number"}, {"type": "integer"}]}}}));
    assert_eq!(relaxations, one("oneOf", "/properties/n"));
    let message = strict(schema).unwrap_err().to_string();
    assert!(message.contains("`oneOf` at /properties/n"), "{message}");
}

#[test]
fn one_of_next_to_any_of_keeps_both() {
    let (schema, _) = relaxed(json!({"anyOf": [{"type": "string"}], "oneOf": [{"type": "string"}, {"type": "null"}]}));
    assert_eq!(schema, json!({"allOf": [{"anyOf": [{"type": "string"}]}, {"anyOf": [{"type": "string"}, {"type": "null"}]}]}));
}

#[test]
fn unknown_formats_are_dropped_known_kept() {
    let (schema, relaxations) =
        relaxed(json!({"properties": {"u": {"type": "string", "format": "url"}, "e": {"format": "email"}, "i": {"type": "integer", "format": "int32"}}}));
    assert_eq!(schema, json!({"properties": {"u": {"type": "string"}, "e": {"format": "email"}, "i": {"type": "integer"}}}));
    assert_eq!(relaxations, one("format", "/properties/u"));
    assert!(strict(json!({"format": "color"})).is_err());
}

#[test]
fn look_ahead_keywords_are_dropped_and_reported_where_they_are() {
    for keyword in ["not", "dependencies", "dependentRequired", "dependentSchemas", "propertyNames", "contains", "if", "unevaluatedProperties"] {
        let schema = json!({"type": "object", "additionalProperties": {"type": "array", "items": {keyword: {"type": "string"}}}});
        let (relaxed_schema, relaxations) = relaxed(schema.clone());
        assert_eq!(relaxed_schema, json!({"type": "object", "additionalProperties": {"type": "array", "items": {}}}), "{keyword}");
        assert_eq!(relaxations, one(keyword, "/additionalProperties/items"));
        assert!(strict(schema).unwrap_err().to_string().contains(&format!("`{keyword}` at /additionalProperties/items")));
    }
}

#[test]
fn unique_items_is_dropped_silently_only_when_it_cannot_fail() {
    assert_eq!(relaxed(json!({"uniqueItems": false})), (json!({}), vec![]));
    assert_eq!(relaxed(json!({"uniqueItems": true, "maxItems": 1})), (json!({"maxItems": 1}), vec![]));
    assert_eq!(relaxed(json!({"prefixItems": [{"uniqueItems": true}]})), (json!({"prefixItems": [{}]}), one("uniqueItems", "/prefixItems/0")));
    assert!(strict(json!({"uniqueItems": true})).is_err());
}

#[test]
fn object_size_is_kept_dropped_or_relaxed() {
    let implied = json!({"required": ["a", "b"], "minProperties": 2});
    assert_eq!(relaxed(implied), (json!({"required": ["a", "b"]}), vec![]));
    let enforced = json!({"properties": {"a": {}, "b": {}}, "additionalProperties": false, "minProperties": 1, "maxProperties": 1});
    assert_eq!(relaxed(enforced.clone()), (enforced, vec![]));
    let (_, relaxations) = relaxed(json!({"minProperties": 2, "maxProperties": 5}));
    assert_eq!(relaxations, vec![("minProperties".into(), String::new()), ("maxProperties".into(), String::new())]);
}

#[test]
fn annotations_are_dropped_silently_and_literals_are_not_walked() {
    let schema = json!({"deprecated": true, "$dynamicAnchor": "x", "const": {"not": 1}, "properties": {"not": {"type": "string"}}});
    assert_eq!(relaxed(schema), (json!({"const": {"not": 1}, "properties": {"not": {"type": "string"}}}), vec![]));
}

#[test]
fn pointers_escape_property_names() {
    let (_, relaxations) = relaxed(json!({"properties": {"a/b~c": {"not": {}}}}));
    assert_eq!(relaxations, one("not", "/properties/a~1b~0c"));
}

#[test]
fn keywords_beside_ref_go_in_drafts_that_ignore_them() {
    let draft_4 = json!({"$schema": "http://json-schema.org/draft-04/schema#", "$ref": "#/definitions/a", "type": "object",
        "definitions": {"a": {"type": "object"}}});
    let (schema, relaxations) = relaxed(draft_4);
    assert_eq!(schema, json!({"$schema": "http://json-schema.org/draft-04/schema#", "$ref": "#/definitions/a", "definitions": {"a": {"type": "object"}}}));
    assert!(relaxations.is_empty());
    let draft_2020 = json!({"$ref": "#/$defs/a", "type": "object", "$defs": {"a": {}}});
    assert_eq!(relaxed(draft_2020.clone()).0, draft_2020);
}

#[test]
fn schemas_under_unknown_keywords_are_walked_too() {
    let schema = json!({"$ref": "#/components/x", "components": {"x": {"uniqueItems": true}}, "self": {"format": "jsonschema"}});
    assert_eq!(relaxed(schema).1, one("uniqueItems", "/components/x"));
}

#[test]
fn patterns_with_look_around_are_dropped() {
    let (schema, relaxations) = relaxed(json!({"properties": {"a": {"pattern": "^(?!x)\\w+\\b"}, "b": {"pattern": "^[a-z]+$"}}}));
    assert_eq!(schema, json!({"properties": {"a": {}, "b": {"pattern": "^[a-z]+$"}}}));
    assert_eq!(relaxations, one("pattern", "/properties/a"));
}

#[test]
fn type_beside_any_of_goes_when_every_branch_narrows_to_it() {
    let schema = json!({"type": ["object", "number"], "anyOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}, {"const": 1.5}],
        "$defs": {"a": {"type": "object"}}});
    let (relaxed_schema, relaxations) = relaxed(schema);
    assert_eq!(relaxed_schema, json!({"anyOf": [{"$ref": "#/$defs/a"}, {"type": "integer"}, {"const": 1.5}], "$defs": {"a": {"type": "object"}}}));
    assert!(relaxations.is_empty());
    let open_branch = json!({"type": "object", "anyOf": [{"type": "object"}, {"required": ["a"]}]});
    assert_eq!(relaxed(open_branch.clone()).0, open_branch);
}

#[test]
fn schemas_allowing_anything_are_dropped() {
    let schema = json!({"additionalProperties": {}, "items": true, "additionalItems": {"type": "string"}, "properties": {"a": {}}});
    assert_eq!(relaxed(schema), (json!({"additionalItems": {"type": "string"}, "properties": {"a": {}}}), vec![]));
}

#[test]
fn look_around_pattern_keys_widen_additional_properties() {
    let schema = json!({"properties": {"name": {"type": "string"}}, "patternProperties": {"^(?!name).+$": {"type": "integer"}},
        "additionalProperties": false});
    let (relaxed_schema, relaxations) = relaxed(schema);
    assert_eq!(relaxed_schema, json!({"properties": {"name": {"type": "string"}}, "additionalProperties": {"type": "integer"}}));
    assert_eq!(relaxations, one("patternProperties", ""));
    let (beside_other, _) = relaxed(json!({"patternProperties": {"^(?!x)": {"type": "integer"}, "^x": {}}, "additionalProperties": {"type": "null"}}));
    assert_eq!(beside_other, json!({"patternProperties": {"^x": {}}, "additionalProperties": {"anyOf": [{"type": "integer"}, {"type": "null"}]}}));
    let (open, _) = relaxed(json!({"patternProperties": {"^(?!x)": {"type": "integer"}}}));
    assert_eq!(open, json!({}));
}

#[test]
fn named_properties_under_a_pattern_keep_what_llguidance_can_intersect() {
    let defs = json!({"node": {"type": "object", "properties": {"children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}},
        "leaf": {"type": "string"}});
    let schema =
        |properties: Value| json!({"properties": properties, "patternProperties": {".*": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "$defs": defs});
    // Saying no more than the pattern (descriptions aside): exact without the property's schema.
    let same = relaxed(schema(json!({"a": {"type": "array", "items": {"$ref": "#/$defs/node"}, "title": "A"}})));
    assert_eq!(same, (schema(json!({"a": {}})), vec![]));
    // Saying more, through a recursive reference: the pattern's schema only, reported.
    let (different, relaxations) = relaxed(schema(json!({"a": {"type": "array", "maxItems": 1}})));
    assert_eq!(different, schema(json!({"a": {}})));
    assert_eq!(relaxations, one("properties", "/properties/a"));
    // Nothing recursive: llguidance intersects them.
    let plain = json!({"properties": {"a": {"maxLength": 3}}, "patternProperties": {"^a": {"$ref": "#/$defs/leaf"}}, "$defs": defs});
    assert_eq!(relaxed(plain.clone()), (plain, vec![]));
}
