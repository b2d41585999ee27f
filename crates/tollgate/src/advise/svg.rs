//! Plots as inline SVG text: a line chart (step lines, for counts over time) and a grouped bar
//! chart. Used by `advise --html` and `simulate --plot`. The output depends only on the data
//! (fixed number formatting, no randomness), so a committed picture can be regenerated and
//! compared byte for byte.

use std::fmt::Write;

/// The colours of successive series (distinguishable in print and for common colour blindness).
const COLOURS: [&str; 8] = [
    "#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000", "#f0e442",
];

const W: f64 = 720.0;
const H: f64 = 360.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 180.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 48.0;

/// One named series of points `(x, y)`, x ascending.
pub(crate) struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// XML-escape text.
pub(crate) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A "nice" tick step for a range of `span` split into about `n` parts: 1, 2 or 5 times a
/// power of ten.
fn nice_step(span: f64, n: f64) -> f64 {
    if span <= 0.0 || !span.is_finite() {
        return 1.0;
    }
    let raw = span / n;
    let mag = 10f64.powf(raw.log10().floor());
    let f = raw / mag;
    let m = if f <= 1.0 {
        1.0
    } else if f <= 2.0 {
        2.0
    } else if f <= 5.0 {
        5.0
    } else {
        10.0
    };
    m * mag
}

/// A number as a tick label: no trailing zeros, at most 3 decimals.
fn label(v: f64) -> String {
    let s = format!("{v:.3}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".into()
    } else {
        s.into()
    }
}

fn header(out: &mut String, title: &str) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {W} {H}\" width=\"{W}\" \
         height=\"{H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"{W}\" height=\"{H}\" fill=\"#ffffff\"/>\n\
         <text x=\"{}\" y=\"20\" font-size=\"14\" font-weight=\"bold\">{}</text>\n",
        LEFT,
        esc(title)
    );
}

/// Axes, grid and tick labels for `[x0, x1] × [0, y1]`; returns the point-to-pixel mapping.
fn axes(
    out: &mut String,
    (x0, x1): (f64, f64),
    y1: f64,
    x_label: &str,
    y_label: &str,
    x_ticks: bool,
) -> impl Fn(f64, f64) -> (f64, f64) {
    let pw = W - LEFT - RIGHT;
    let ph = H - TOP - BOTTOM;
    let xs = if x1 > x0 { x1 - x0 } else { 1.0 };
    let ys = if y1 > 0.0 { y1 } else { 1.0 };
    let map = move |x: f64, y: f64| (LEFT + (x - x0) / xs * pw, TOP + ph - y / ys * ph);
    let ystep = nice_step(ys, 5.0);
    let mut y = 0.0;
    while y <= ys + ystep * 1e-9 {
        let (_, py) = map(x0, y);
        let _ = writeln!(
            out,
            "<line x1=\"{LEFT}\" y1=\"{py:.1}\" x2=\"{:.1}\" y2=\"{py:.1}\" stroke=\"#dddddd\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            LEFT + pw,
            LEFT - 6.0,
            py + 4.0,
            label(y)
        );
        y += ystep;
    }
    if x_ticks {
        let xstep = nice_step(xs, 6.0);
        let mut x = (x0 / xstep).ceil() * xstep;
        while x <= x1 + xstep * 1e-9 {
            let (px, _) = map(x, 0.0);
            let _ = writeln!(
                out,
                "<line x1=\"{px:.1}\" y1=\"{:.1}\" x2=\"{px:.1}\" y2=\"{:.1}\" stroke=\"#888888\"/>\
                 <text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                TOP + ph,
                TOP + ph + 4.0,
                TOP + ph + 17.0,
                label(x)
            );
            x += xstep;
        }
    }
    let _ = writeln!(
        out,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{:.1}\" stroke=\"#000000\"/>\
         <line x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#000000\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
         <text transform=\"translate(14 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        TOP + ph,
        TOP + ph,
        LEFT + pw,
        TOP + ph,
        LEFT + pw / 2.0,
        H - 10.0,
        esc(x_label),
        TOP + ph / 2.0,
        esc(y_label)
    );
    map
}

fn legend(out: &mut String, names: &[&str]) {
    for (i, name) in names.iter().enumerate() {
        let y = TOP + 8.0 + 18.0 * i as f64;
        let x = W - RIGHT + 12.0;
        let _ = writeln!(
            out,
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{}\"/>\
             <text x=\"{:.1}\" y=\"{y:.1}\">{}</text>",
            y - 10.0,
            COLOURS[i % COLOURS.len()],
            x + 18.0,
            esc(name)
        );
    }
}

/// A line chart of `series` as step lines (each value holds until the next point).
pub(crate) fn step_chart(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> String {
    let mut out = String::new();
    header(&mut out, title);
    let all = || series.iter().flat_map(|s| s.points.iter());
    let x0 = all().map(|p| p.0).fold(f64::INFINITY, f64::min);
    let x1 = all().map(|p| p.0).fold(f64::NEG_INFINITY, f64::max);
    let (x0, x1) = if x0.is_finite() { (x0, x1) } else { (0.0, 1.0) };
    let y1 = all().map(|p| p.1).fold(0.0, f64::max);
    let map = axes(&mut out, (x0, x1), y1 * 1.05, x_label, y_label, true);
    for (i, s) in series.iter().enumerate() {
        let mut d = String::new();
        for (j, &(x, y)) in s.points.iter().enumerate() {
            let (px, py) = map(x, y);
            // A step: along at the previous value, then up or down to this one.
            let _ = if j == 0 {
                write!(d, "M{px:.1},{py:.1}")
            } else {
                write!(d, " H{px:.1} V{py:.1}")
            };
        }
        let _ = writeln!(
            out,
            "<path d=\"{d}\" fill=\"none\" stroke=\"{}\" stroke-width=\"2\"/>",
            COLOURS[i % COLOURS.len()]
        );
    }
    let names: Vec<&str> = series.iter().map(|s| s.name.as_str()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

/// A grouped bar chart: one group per category, one bar per series in each.
pub(crate) fn bar_chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    categories: &[String],
    series: &[(String, Vec<f64>)],
) -> String {
    let mut out = String::new();
    header(&mut out, title);
    let y1 = series
        .iter()
        .flat_map(|s| s.1.iter().copied())
        .fold(0.0, f64::max);
    let n = categories.len().max(1) as f64;
    let map = axes(&mut out, (0.0, n), y1 * 1.05, x_label, y_label, false);
    let group = (W - LEFT - RIGHT) / n;
    let bar = group * 0.8 / series.len().max(1) as f64;
    for (c, cat) in categories.iter().enumerate() {
        for (i, (name, values)) in series.iter().enumerate() {
            let v = values.get(c).copied().unwrap_or(0.0);
            let (px, py) = map(c as f64, v);
            let (_, base) = map(0.0, 0.0);
            let x = px + group * 0.1 + bar * i as f64;
            let _ = writeln!(
                out,
                "<rect x=\"{x:.1}\" y=\"{py:.1}\" width=\"{bar:.1}\" height=\"{:.1}\" \
                 fill=\"{}\"><title>{}: {}</title></rect>",
                (base - py).max(0.0),
                COLOURS[i % COLOURS.len()],
                esc(name),
                label(v)
            );
        }
        let (px, base) = map(c as f64 + 0.5, 0.0);
        let _ = writeln!(
            out,
            "<text x=\"{px:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            base + 16.0,
            esc(cat)
        );
    }
    let names: Vec<&str> = series.iter().map(|s| s.0.as_str()).collect();
    legend(&mut out, &names);
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_round() {
        assert_eq!(nice_step(100.0, 5.0), 20.0);
        assert_eq!(nice_step(7.0, 5.0), 2.0);
        assert_eq!(label(2.5000), "2.5");
        assert_eq!(label(20.0), "20");
    }

    #[test]
    fn charts_escape_names() {
        let svg = step_chart(
            "a<b",
            "x",
            "y",
            &[Series {
                name: "r&d".into(),
                points: vec![(0.0, 0.0), (1.0, 2.0)],
            }],
        );
        assert!(svg.contains("a&lt;b") && svg.contains("r&amp;d"));
        let bars = bar_chart("t", "x", "y", &["c".into()], &[("s".into(), vec![1.0])]);
        assert!(bars.starts_with("<svg") && bars.ends_with("</svg>\n"));
    }
}
