//! The one reader of the Prometheus text exposition (`/metrics`).

/// One sample line: `name{labels} value`.
struct Sample<'a> {
    name: &'a str,
    /// Inside the braces, `""` without labels.
    labels: &'a str,
    value: f64,
}

fn parse_line(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') {
        return None;
    }
    let (series, value) = line.rsplit_once(' ')?;
    let (name, labels) = match series.split_once('{') {
        Some((name, labels)) => (name, labels.trim_end_matches('}')),
        None => (series, ""),
    };
    Some(Sample {
        name,
        labels,
        value: value.parse().ok()?,
    })
}

/// A scraped Prometheus text exposition.
#[derive(Clone, Debug)]
pub struct Metrics(pub String);

impl Metrics {
    fn samples(&self) -> impl Iterator<Item = Sample<'_>> {
        self.0.lines().filter_map(parse_line)
    }

    /// The sum of the samples of `name` whose labels include all of `labels`;
    /// `None` when no sample matches.
    pub fn get(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        self.samples()
            .filter(|s| s.name == name)
            .filter(|s| {
                labels.iter().all(|(k, v)| {
                    let wanted = format!("{k}=\"{v}\"");
                    s.labels.split(',').any(|kv| kv == wanted)
                })
            })
            .map(|s| s.value)
            .reduce(|a, b| a + b)
    }

    /// Like [`Metrics::get`], 0 when absent.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        // `+ 0.0` keeps an absent series at 0 and never -0.
        self.get(name, labels).unwrap_or(0.0) + 0.0
    }

    /// The sum of every series of `name`.
    pub fn sum(&self, name: &str) -> f64 {
        self.value(name, &[])
    }

    /// `({labels}, value)` of every series of `name`.
    pub fn series(&self, name: &str) -> Vec<(String, f64)> {
        self.samples()
            .filter(|s| s.name == name)
            .map(|s| {
                let labels = if s.labels.is_empty() {
                    String::new()
                } else {
                    format!("{{{}}}", s.labels)
                };
                (labels, s.value)
            })
            .collect()
    }

    /// Whether any sample of a series whose name starts with `prefix` exists.
    pub fn has_series(&self, prefix: &str) -> bool {
        self.0
            .lines()
            .any(|l| !l.starts_with('#') && l.starts_with(prefix))
    }
}

/// Series of `name` whose value grew between two scrapes, as `labels: +delta`.
pub fn grown(before: &Metrics, after: &Metrics, name: &str) -> Vec<String> {
    let old = before.series(name);
    after
        .series(name)
        .into_iter()
        .filter_map(|(labels, v)| {
            let was = old
                .iter()
                .find(|(l, _)| *l == labels)
                .map(|(_, v)| *v)
                .unwrap_or(0.0);
            (v > was).then(|| format!("{labels}: +{}", v - was))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP w writes\n# TYPE w counter\nw{kind=\"ConfigMap\",verb=\"create\"} 2\nw{kind=\"Deployment\",verb=\"create\"} 1\nup 1\n";

    #[test]
    fn sums_the_series_that_carry_the_labels() {
        let m = Metrics(TEXT.to_owned());
        assert_eq!(m.get("w", &[]), Some(3.0));
        assert_eq!(m.get("w", &[("kind", "ConfigMap")]), Some(2.0));
        assert_eq!(m.get("w", &[("kind", "Secret")]), None);
        assert_eq!(m.value("nope", &[]), 0.0);
        assert_eq!(m.sum("up"), 1.0);
        assert!(m.has_series("w{"));
    }

    #[test]
    fn grown_names_the_series_that_grew() {
        let before = Metrics(TEXT.to_owned());
        let after = Metrics(TEXT.replace("} 1\n", "} 4\n"));
        assert_eq!(
            grown(&before, &after, "w"),
            ["{kind=\"Deployment\",verb=\"create\"}: +3"]
        );
    }
}
