//! Percentiles and rates.

use serde_json::{Value, json};

/// Distribution of a sample, in milliseconds.
#[derive(Clone, Debug, Default)]
pub struct Summary {
    pub count: usize,
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
    pub max: f64,
    pub mean: f64,
}

impl Summary {
    /// From values in seconds; reported in milliseconds. Nearest-rank percentiles.
    pub fn of_seconds(values: &[f64]) -> Summary {
        let mut ms: Vec<f64> = values.iter().map(|v| v * 1000.0).collect();
        if ms.is_empty() {
            return Summary::default();
        }
        ms.sort_by(f64::total_cmp);
        let rank = |p: f64| ms[((p / 100.0 * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Summary {
            count: ms.len(),
            p50: rank(50.0),
            p95: rank(95.0),
            p99: rank(99.0),
            max: ms[ms.len() - 1],
            mean: ms.iter().sum::<f64>() / ms.len() as f64,
        }
    }

    /// `null` without samples.
    pub fn json(&self) -> Value {
        if self.count == 0 {
            return Value::Null;
        }
        json!({ "count": self.count, "p50_ms": self.p50, "p95_ms": self.p95, "p99_ms": self.p99,
                "max_ms": self.max, "mean_ms": self.mean })
    }
}

/// Events per second between the first and the last of `times` (seconds since the epoch of the
/// run); `None` with fewer than two.
pub fn rate(times: &[f64]) -> Option<f64> {
    let first = times.iter().copied().fold(f64::INFINITY, f64::min);
    let last = times.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (times.len() >= 2 && last > first).then(|| (times.len() - 1) as f64 / (last - first))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<f64> = (1..=100).map(|v| f64::from(v) / 1000.0).collect();
        let s = Summary::of_seconds(&values);
        assert_eq!((s.p50.round(), s.p95.round(), s.p99.round(), s.max.round()), (50.0, 95.0, 99.0, 100.0));
        assert_eq!(rate(&[0.0, 0.5, 1.0]), Some(2.0));
    }
}
