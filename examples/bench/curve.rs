//! `--curve DIR...`: how the figures grow from one size to the next, read
//! from the `results.json` each size's run wrote (`BENCH_SCALE=curve`).

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, bail};
use serde_json::Value;

use crate::report::Table;

/// One size's figures.
struct Point {
    scale: String,
    policies: f64,
    servers: f64,
    convergence: f64,
    floor: f64,
    writes: f64,
    peak_rss_mib: f64,
    cpu_seconds: f64,
}

fn number(v: &Value, path: &[&str]) -> Result<f64> {
    let mut at = v;
    for key in path {
        at = at
            .get(key)
            .with_context(|| format!("results.json has no {}", path.join(".")))?;
    }
    at.as_f64()
        .with_context(|| format!("{} is not a number", path.join(".")))
}

fn point(dir: &Path) -> Result<Point> {
    let path = dir.join("results.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value = serde_json::from_str(&text)?;
    let cold = |key: &str| number(&v, &["cold_convergence", key]);
    Ok(Point {
        scale: v["scale"].as_str().unwrap_or("?").to_owned(),
        policies: number(&v, &["sizes", "policies"])?,
        servers: number(&v, &["sizes", "servers"])?,
        convergence: cold("converged_seconds")?,
        floor: number(&v, &["cold_convergence", "floor", "floor_seconds"])?,
        writes: cold("api_writes")?,
        // The highest of every phase: cold start to idle, and the restart
        // with unrelated objects.
        peak_rss_mib: number(&v, &["footprint", "scenarios_1_3", "peak_rss_mib"])?.max(number(
            &v,
            &["footprint", "with_unrelated", "peak_rss_mib"],
        )?),
        cpu_seconds: cold("cpu_seconds")?,
    })
}

/// Prints the table of every size and the growth between neighbours.
pub fn print(dirs: &[PathBuf]) -> Result<()> {
    let points = dirs.iter().map(|d| point(d)).collect::<Result<Vec<_>>>()?;
    if points.is_empty() {
        bail!("--curve needs at least one results folder");
    }
    let mut t = Table::default();
    for p in &points {
        t.add(
            "size",
            format!("{}: {} policies, {} servers", p.scale, p.policies, p.servers),
            format!(
                "converge {:.1} s, floor {:.1} s ({:.2}x); writes {}; peak RSS {:.1} MiB; CPU {:.1} s",
                p.convergence,
                p.floor,
                p.convergence / p.floor,
                p.writes,
                p.peak_rss_mib,
                p.cpu_seconds
            ),
            "",
        );
    }
    for pair in points.windows(2) {
        let (a, b) = (&pair[0], &pair[1]);
        let grew = b.policies / a.policies;
        // Exponent k of figure ~ size^k between the two sizes: 1 is linear.
        let slope = |fa: f64, fb: f64| (fb / fa).ln() / grew.ln();
        t.add(
            "growth",
            format!("{} -> {} ({grew:.0}x the objects)", a.scale, b.scale),
            format!(
                "convergence x{:.1} (k={:.2}), writes x{:.1} (k={:.2}), peak RSS x{:.2} (k={:.2}), CPU x{:.1} (k={:.2})",
                b.convergence / a.convergence,
                slope(a.convergence, b.convergence),
                b.writes / a.writes,
                slope(a.writes, b.writes),
                b.peak_rss_mib / a.peak_rss_mib,
                slope(a.peak_rss_mib, b.peak_rss_mib),
                b.cpu_seconds / a.cpu_seconds,
                slope(a.cpu_seconds, b.cpu_seconds),
            ),
            "k <= 1",
        );
    }
    println!("\nhow the cost grows (figure ~ size^k; k = 1 is linear)\n");
    print!("{}", t.render());
    Ok(())
}
