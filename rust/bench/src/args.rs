//! Hand-rolled `--name value` / `--name=value` parsing: each subcommand takes the options it
//! knows, then `finish` rejects whatever is left, so a typo is an error rather than ignored.

use std::collections::BTreeMap;

pub struct Args {
    options: BTreeMap<String, String>,
}

impl Args {
    pub fn parse(raw: &[String]) -> Result<Args, String> {
        let mut options = BTreeMap::new();
        let mut rest = raw.iter();
        while let Some(arg) = rest.next() {
            let name = arg.strip_prefix("--").ok_or_else(|| format!("unexpected argument {arg:?}"))?;
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_string(), v.to_string()),
                None => {
                    let value = rest.next().ok_or_else(|| format!("--{name} needs a value"))?;
                    (name.to_string(), value.clone())
                }
            };
            if options.insert(name.clone(), value).is_some() {
                return Err(format!("--{name} is given twice"));
            }
        }
        Ok(Args { options })
    }

    pub fn string(&mut self, name: &str) -> Option<String> {
        self.options.remove(name)
    }

    pub fn usize_or(&mut self, name: &str, default: usize) -> Result<usize, String> {
        self.string(name).map_or(Ok(default), |v| parse_usize(name, &v))
    }

    /// A comma-separated list such as `--batch 1,8`.
    pub fn usize_list_or(&mut self, name: &str, default: &[usize]) -> Result<Vec<usize>, String> {
        match self.string(name) {
            None => Ok(default.to_vec()),
            Some(v) => v.split(',').map(|item| parse_usize(name, item.trim())).collect(),
        }
    }

    pub fn finish(self) -> Result<(), String> {
        match self.options.keys().next() {
            None => Ok(()),
            Some(name) => Err(format!("unknown option --{name}")),
        }
    }
}

fn parse_usize(name: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("--{name} wants a positive integer, got {value:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::Args;

    fn args(line: &str) -> Result<Args, String> {
        Args::parse(&line.split_whitespace().map(String::from).collect::<Vec<_>>())
    }

    #[test]
    fn reads_both_spellings_and_lists() {
        let mut a = args("--threads 4 --batch=1,8 --json out.json").unwrap();
        assert_eq!(a.usize_or("threads", 1), Ok(4));
        assert_eq!(a.usize_list_or("batch", &[2]), Ok(vec![1, 8]));
        assert_eq!(a.usize_or("gen-len", 32), Ok(32));
        assert_eq!(a.string("json").as_deref(), Some("out.json"));
        assert!(a.finish().is_ok());
    }

    #[test]
    fn rejects_typos_repeats_and_bad_numbers() {
        assert!(args("--treads 2").unwrap().finish().unwrap_err().contains("--treads"));
        assert!(args("--threads 1 --threads 2").is_err());
        assert!(args("--threads").is_err());
        assert!(args("threads").is_err());
        assert!(args("--threads 0").unwrap().usize_or("threads", 1).is_err());
        assert!(args("--batch 1,x").unwrap().usize_list_or("batch", &[1]).is_err());
    }
}
