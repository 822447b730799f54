//! The printed table and the figures' formatting.

use std::time::Duration;

/// One row of the table.
pub struct Row {
    pub scenario: &'static str,
    pub figure: String,
    pub value: String,
    pub goal: String,
}

#[derive(Default)]
pub struct Table {
    pub rows: Vec<Row>,
}

impl Table {
    pub fn add(
        &mut self,
        scenario: &'static str,
        figure: impl Into<String>,
        value: impl Into<String>,
        goal: impl Into<String>,
    ) {
        self.rows.push(Row {
            scenario,
            figure: figure.into(),
            value: value.into(),
            goal: goal.into(),
        });
    }

    /// A Markdown table (also readable in a terminal).
    pub fn render(&self) -> String {
        let headers = ["Scenario", "Figure", "Value", "Goal"];
        let cells: Vec<[&str; 4]> = self
            .rows
            .iter()
            .map(|r| [r.scenario, &r.figure, &r.value, &r.goal])
            .collect();
        let mut widths = headers.map(str::len);
        for row in &cells {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |row: [&str; 4]| {
            let mut s = String::from("|");
            for (c, w) in row.iter().zip(widths) {
                s.push_str(&format!(" {c:<w$} |"));
            }
            s.push('\n');
            s
        };
        let mut out = line(headers);
        out.push('|');
        for w in widths {
            out.push_str(&format!("{}|", "-".repeat(w + 2)));
        }
        out.push('\n');
        for row in cells {
            out.push_str(&line(row));
        }
        out
    }
}

pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

pub fn ms(d: Duration) -> String {
    format!("{:.0} ms", d.as_secs_f64() * 1000.0)
}

pub fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// Nearest-rank percentile of sorted values.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

pub fn verdict(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}
