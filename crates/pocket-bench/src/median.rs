//! The median, which every summary of measured values takes (a leaf: the per-mode summaries
//! and the concurrency results both use it).

/// The median (the mean of the middle two for an even count); `None` for no values. NaN
/// values are ignored.
pub(crate) fn median(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let mut v: Vec<f64> = values.into_iter().filter(|x| !x.is_nan()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_even_and_empty_lists() {
        assert_eq!(median([5.0, 1.0, 3.0]), Some(3.0));
        assert_eq!(median([4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(median([7.0]), Some(7.0));
        assert_eq!(median([f64::NAN, 2.0]), Some(2.0));
        assert_eq!(median(std::iter::empty()), None);
    }
}
