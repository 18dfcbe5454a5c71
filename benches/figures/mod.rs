//! What the benches share: repeated samples printed as the median with min and max,
//! and the runtime they drive `lull run` processes from.

/// Repeated samples of one figure.
#[derive(Debug, Default, Clone)]
pub(crate) struct Figure {
    samples: Vec<f64>,
}

impl Figure {
    pub(crate) fn push(&mut self, value: f64) {
        self.samples.push(value);
    }

    pub(crate) fn sorted(&self) -> Vec<f64> {
        let mut v = self.samples.clone();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v
    }

    pub(crate) fn median(&self) -> f64 {
        let v = self.sorted();
        if v.is_empty() {
            return f64::NAN;
        }
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    }

    pub(crate) fn cell(&self, unit: &str) -> String {
        let v = self.sorted();
        match v.as_slice() {
            [] => "–".into(),
            [one] => format!("{} {unit}", fmt(*one)),
            _ => format!(
                "{} {unit} ({}–{})",
                fmt(self.median()),
                fmt(v[0]),
                fmt(v[v.len() - 1])
            ),
        }
    }
}

pub(crate) fn fmt(value: f64) -> String {
    if value.abs() >= 100.0 {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else if value.abs() >= 0.1 {
        format!("{value:.2}")
    } else {
        format!("{value:.3}")
    }
}

/// The multi-threaded runtime a bench runs on.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}
