//! The results as an SVG chart: decode tok/s per mode and prompt kind, and the cost curve;
//! or two results side by side (`--compare`).

use std::path::Path;

use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::Error;
use super::compare::Comparison;
use super::results::{BenchResults, CostPoint};

/// Mode colours, in run order (llama.cpp first by convention, then ours).
const COLORS: [RGBColor; 6] = [
    RGBColor(120, 120, 120),
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];

/// Minor grid lines: barely there.
const LIGHT: RGBColor = RGBColor(245, 245, 245);

const SIZE: (u32, u32) = (1150, 480);

/// Draw `results` into the SVG file `path`.
pub fn write_svg(results: &BenchResults, path: &Path) -> Result<(), Error> {
    write_file(render_svg(results), path)
}

/// Draw a comparison into the SVG file `path`.
pub fn write_compare_svg(comparison: &Comparison, path: &Path) -> Result<(), Error> {
    write_file(render_compare_svg(comparison), path)
}

fn write_file(svg: Result<String, String>, path: &Path) -> Result<(), Error> {
    let svg = svg.map_err(|message| Error::Chart { path: path.to_owned(), message })?;
    std::fs::write(path, svg).map_err(|error| Error::Io {
        action: "write the chart",
        path: path.to_owned(),
        error,
    })
}

/// The chart as an SVG document: on the left, grouped bars of median decode tok/s (all
/// prompts, then per kind) with one bar per mode; on the right, the cost curve t(n)/t(1)
/// against linear cost.
pub fn render_svg(r: &BenchResults) -> Result<String, String> {
    let (groups, modes, values) = bar_values(r);
    let bars = Bars {
        caption: format!(
            "decode tok/s (median) — {}, {} threads, {}",
            r.model.name, r.machine.threads, r.machine.backend
        ),
        groups,
        series: modes,
        values,
    };
    let curves = [Curve {
        label: format!("measured (our engine), t(1) = {:.1} ms", t1_ms(&r.cost_curve)),
        points: &r.cost_curve,
        color: COLORS[1],
    }];
    render(&bars, &curves, r.settings.cost_curve_context)
}

/// A comparison as an SVG document: on the left, median decode tok/s per mode with a bar
/// for each side; on the right, both cost curves.
pub fn render_compare_svg(c: &Comparison) -> Result<String, String> {
    let [a, b] = &c.sides;
    let bars = Bars {
        caption: format!(
            "decode tok/s (median) — A: {} ({}), B: {} ({})",
            a.label, a.results.machine.backend, b.label, b.results.machine.backend
        ),
        groups: c.rows.iter().map(|r| r.mode.clone()).collect(),
        series: vec![format!("A: {}", a.label), format!("B: {}", b.label)],
        values: (0..2).map(|s| c.rows.iter().map(|r| r.decode[s]).collect()).collect(),
    };
    let curves: Vec<Curve<'_>> = c
        .sides
        .iter()
        .zip(["A", "B"])
        .zip([COLORS[1], COLORS[2]])
        .map(|((side, tag), color)| Curve {
            label: format!("{tag}: {}, t(1) = {:.1} ms", side.label, t1_ms(&side.results.cost_curve)),
            points: &side.results.cost_curve,
            color,
        })
        .collect();
    render(&bars, &curves, a.results.settings.cost_curve_context)
}

/// Milliseconds of one single-token call.
fn t1_ms(curve: &[CostPoint]) -> f64 {
    curve.iter().min_by_key(|p| p.n).map_or(0.0, |p| p.seconds * 1e3)
}

/// Grouped bars: `values[series][group]`, one bar per series in each group.
struct Bars {
    caption: String,
    groups: Vec<String>,
    series: Vec<String>,
    values: Vec<Vec<Option<f64>>>,
}

/// A cost curve and its legend entry.
struct Curve<'a> {
    label: String,
    points: &'a [CostPoint],
    color: RGBColor,
}

fn render(bars: &Bars, curves: &[Curve<'_>], context: usize) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| e.to_string())?;
        let (left, right) = root.split_horizontally(SIZE.0 * 62 / 100);
        draw_bars(&left, bars).map_err(|e| e.to_string())?;
        draw_cost_curves(&right, curves, context).map_err(|e| e.to_string())?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(svg)
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;
type DrawResult = Result<(), Box<dyn std::error::Error + 'static>>;

/// Median decode tok/s per (group, mode): group 0 is all prompts, then one per kind.
fn bar_values(r: &BenchResults) -> (Vec<String>, Vec<String>, Vec<Vec<Option<f64>>>) {
    let modes: Vec<String> = r.modes().into_iter().map(String::from).collect();
    let mut kinds: Vec<_> = r.runs.iter().map(|run| run.kind).collect();
    kinds.sort();
    kinds.dedup();
    let mut groups = vec!["all prompts".to_string()];
    groups.extend(kinds.iter().map(|k| k.to_string()));
    let values = modes
        .iter()
        .map(|m| {
            let s = r.summary.get(m);
            let mut v = vec![s.and_then(|s| s.decode_tok_per_s_median)];
            v.extend(
                kinds
                    .iter()
                    .map(|k| s.and_then(|s| s.by_kind.get(k)).and_then(|k| k.decode_tok_per_s_median)),
            );
            v
        })
        .collect();
    (groups, modes, values)
}

fn draw_bars(area: &Area<'_>, bars: &Bars) -> DrawResult {
    let Bars { caption, groups, series: modes, values } = bars;
    let top = values.iter().flatten().flatten().copied().fold(0.0, f64::max);
    // Headroom for the value labels and the legend.
    let top = if top > 0.0 { top * 1.35 } else { 1.0 };
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(34)
        .y_label_area_size(56)
        // Group g is centred on x = g: with one label per unit, the labels fall on the groups.
        .build_cartesian_2d(-0.5f64..groups.len() as f64 - 0.5, 0f64..top)?;
    let label = |x: &f64| {
        let g = x.round();
        if (x - g).abs() > 1e-6 || g < 0.0 {
            return String::new();
        }
        groups.get(g as usize).cloned().unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(groups.len())
        .x_label_formatter(&label)
        .x_label_style(("sans-serif", 14))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .light_line_style(LIGHT)
        .y_desc("tokens / s")
        .draw()?;

    let width = 0.8 / modes.len().max(1) as f64;
    for (m, mode) in modes.iter().enumerate() {
        let color = COLORS[m % COLORS.len()];
        let bars: Vec<(f64, f64)> = values[m]
            .iter()
            .enumerate()
            .filter_map(|(g, v)| Some((g as f64 - 0.4 + m as f64 * width, (*v)?)))
            .collect();
        chart
            .draw_series(
                bars.iter().map(|&(x, v)| Rectangle::new([(x, 0.0), (x + width * 0.9, v)], color.filled())),
            )?
            .label(mode.as_str())
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 14, y + 6)], color.filled()));
        let style = TextStyle::from(("sans-serif", 12).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom));
        chart.draw_series(
            bars.iter().map(|&(x, v)| Text::new(format!("{v:.0}"), (x + width * 0.45, v), style.clone())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    Ok(())
}

fn draw_cost_curves(area: &Area<'_>, curves: &[Curve<'_>], context: usize) -> DrawResult {
    let all = || curves.iter().flat_map(|c| c.points.iter());
    if all().next().is_none() {
        area.draw(&Text::new("cost curve not measured", (40, 40), ("sans-serif", 16)))?;
        return Ok(());
    }
    let n_max = all().map(|p| p.n).max().unwrap_or(1) as f64;
    let rel_max = all().map(|p| p.relative).fold(1.0, f64::max);
    let top = (rel_max * 1.25).max(2.0);
    let caption = format!("verification cost t(n)/t(1) at {context} ctx");
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(34)
        .y_label_area_size(44)
        .build_cartesian_2d(0f64..n_max + 1.0, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("tokens per decode call")
        .y_desc("relative time")
        .light_line_style(LIGHT)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .draw()?;
    // Linear cost: what verification would cost if n tokens took n times one token.
    let linear_end = n_max.min(top);
    chart
        .draw_series(DashedLineSeries::new(
            [(1.0, 1.0), (linear_end, linear_end)],
            6,
            4,
            RGBColor(150, 150, 150).stroke_width(1),
        ))?
        .label("linear: t(n) = n·t(1)")
        .legend(|(x, y)| PathElement::new([(x, y), (x + 16, y)], RGBColor(150, 150, 150)));
    for curve in curves.iter().filter(|c| !c.points.is_empty()) {
        let color = curve.color;
        let points: Vec<(f64, f64)> = curve.points.iter().map(|p| (p.n as f64, p.relative)).collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(curve.label.as_str())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2)));
        chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        let style = ("sans-serif", 12).into_font().color(&color).pos(Pos::new(HPos::Right, VPos::Bottom));
        chart.draw_series(
            points
                .iter()
                .map(|&(n, rel)| Text::new(format!("{rel:.2}x"), (n - 0.2, rel + top * 0.02), style.clone())),
        )?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results_sample::sample;

    #[test]
    fn renders_bars_labels_and_the_cost_curve() {
        let svg = render_svg(&sample()).unwrap();
        assert!(svg.starts_with("<svg"), "{}", &svg[..80]);
        for text in ["vanilla", "llama.cpp", "all prompts", "edit", "measured (our engine)"] {
            assert!(svg.contains(text), "{text} missing");
        }
        let mut empty = sample();
        empty.cost_curve.clear();
        empty.runs.clear();
        empty.summary.clear();
        assert!(render_svg(&empty).unwrap().contains("cost curve not measured"));
    }

    #[test]
    fn a_comparison_draws_both_sides_bars_and_curves() {
        use crate::compare::{Side, compare};
        let mut b = sample();
        b.machine.backend = "Vulkan0".into();
        let c = compare(
            Side { label: "cpu".into(), results: sample() },
            Side { label: "lavapipe".into(), results: b },
        );
        let svg = render_compare_svg(&c).unwrap();
        for text in ["A: cpu", "B: lavapipe", "Vulkan0", "llama.cpp", "vanilla", "t(1) = 7.1 ms"] {
            assert!(svg.contains(text), "{text} missing");
        }
    }
}
