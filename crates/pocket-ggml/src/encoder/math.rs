//! The element-wise arithmetic of the encoder — layer norm, GELU, softmax — in plain loops that
//! the compiler turns into vector instructions: sums kept in [`LANES`] partial sums (a float sum
//! in one accumulator is a chain the compiler may not reorder), and `exp` by range reduction and
//! a polynomial instead of libm's one-value-at-a-time `expf`.

/// Partial sums a reduction keeps: one AVX-512 register, two AVX2 or four NEON registers.
const LANES: usize = 16;

/// `Σ a[i]·b[i]`.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    debug_assert_eq!(a.len(), b.len());
    let mut acc = [0f32; LANES];
    let ((ca, ta), (cb, tb)) = (a.as_chunks::<LANES>(), b.as_chunks::<LANES>());
    for (x, y) in ca.iter().zip(cb) {
        for l in 0..LANES {
            acc[l] += x[l] * y[l];
        }
    }
    acc.iter().sum::<f32>() + ta.iter().zip(tb).map(|(x, y)| x * y).sum::<f32>()
}

/// `Σ a[i]`.
fn sum(a: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let (c, tail) = a.as_chunks::<LANES>();
    for x in c {
        for l in 0..LANES {
            acc[l] += x[l];
        }
    }
    acc.iter().sum::<f32>() + tail.iter().sum::<f32>()
}

/// `y[i] += a · x[i]`.
pub(crate) fn axpy(y: &mut [f32], a: f32, x: &[f32]) {
    for (y, x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// Each row of `x` (rows of `w.len()` values) normalized to zero mean and unit variance, then
/// scaled by `w` and shifted by `b` (BERT's LayerNorm).
pub(crate) fn layer_norm(x: &mut [f32], w: &[f32], b: &[f32], eps: f32) {
    let n = w.len();
    for row in x.chunks_exact_mut(n) {
        let mean = sum(row) / n as f32;
        for v in row.iter_mut() {
            *v -= mean;
        }
        let var = dot(row, row) / n as f32;
        let scale = 1.0 / (var + eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(w).zip(b) {
            *v = *v * scale * w + b;
        }
    }
}

/// `e^x`, within a few ulp of the exact value for x in [-87.3, 88.3], where 2ⁿ below stays a
/// normal float (outside, the value at the bound): x = n·ln 2 + r with |r| ≤ ln 2 / 2, e^r by its Taylor polynomial to r⁷, 2ⁿ put into
/// the exponent bits.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding and subtracting 1.5·2²³ rounds to the nearest integer in plain arithmetic.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.3, 88.3);
    let n = (x * std::f32::consts::LOG2_E + ROUND) - ROUND;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    p * f32::from_bits(((n as i32 + 127) as u32) << 23)
}

/// `erf(x)` to within 2e-7 (Abramowitz and Stegun 7.1.26).
#[inline(always)]
fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [0.254_829_6, -0.284_496_74, 1.421_413_8, -1.453_152, 1.061_405_4];
    let ax = x.abs();
    let t = 1.0 / (1.0 + P * ax);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * exp(-ax * ax);
    y.copysign(x)
}

/// GELU in place, as BERT defines it (with erf, not the tanh approximation):
/// `x · (1 + erf(x / √2)) / 2`.
pub(crate) fn gelu(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = 0.5 * *v * (1.0 + erf(*v * std::f32::consts::FRAC_1_SQRT_2));
    }
}

/// The softmax of `x`, in place.
pub(crate) fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    for v in x.iter_mut() {
        *v = exp(*v - max);
    }
    let inv = 1.0 / sum(x);
    for v in x.iter_mut() {
        *v *= inv;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_is_within_a_few_ulp_of_std() {
        let mut worst = 0f64;
        let mut x = -87.0f32;
        while x < 88.0 {
            let (ours, want) = (exp(x) as f64, (x as f64).exp());
            worst = worst.max(((ours - want) / want).abs());
            x += 0.0137;
        }
        assert!(worst < 3e-7, "worst relative error {worst}");
        assert_eq!(exp(-200.0), exp(-87.3));
        assert!(exp(-87.3) < 1e-37);
    }

    #[test]
    fn gelu_matches_its_definition_with_erf() {
        // erf by its series, in f64, as the reference.
        let erf64 = |x: f64| {
            let (mut term, mut s) = (x, x);
            for n in 1..200 {
                term *= -x * x / n as f64;
                s += term / (2 * n + 1) as f64;
            }
            s * 2.0 / std::f64::consts::PI.sqrt()
        };
        let xs: Vec<f32> = (-600..=600).map(|i| i as f32 * 0.01).collect();
        let mut ys = xs.clone();
        gelu(&mut ys);
        for (x, y) in xs.iter().zip(&ys) {
            let want = 0.5 * *x as f64 * (1.0 + erf64(*x as f64 / 2f64.sqrt()));
            assert!((*y as f64 - want).abs() < 1e-6, "gelu({x}) = {y}, want {want}");
        }
    }

    #[test]
    fn layer_norm_and_softmax_match_their_definitions() {
        let mut x: Vec<f32> = (0..40).map(|i| (i as f32 * 0.37).sin() * 3.0 + 1.0).collect();
        let (w, b): (Vec<f32>, Vec<f32>) = (0..20).map(|i| (1.0 + i as f32 * 0.1, i as f32 * -0.05)).unzip();
        let orig = x.clone();
        layer_norm(&mut x, &w, &b, 1e-12);
        for (row, got) in orig.chunks(20).zip(x.chunks(20)) {
            let mean = row.iter().map(|&v| v as f64).sum::<f64>() / 20.0;
            let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / 20.0;
            for i in 0..20 {
                let want = (row[i] as f64 - mean) / var.sqrt() * w[i] as f64 + b[i] as f64;
                assert!((got[i] as f64 - want).abs() < 1e-5, "{} vs {want}", got[i]);
            }
        }
        let mut s = vec![1.0f32, 2.0, 3.0, -50.0, 0.5];
        softmax(&mut s);
        let e: Vec<f64> = [1.0f64, 2.0, 3.0, -50.0, 0.5].iter().map(|v| (v - 3.0).exp()).collect();
        let total: f64 = e.iter().sum();
        for (got, e) in s.iter().zip(&e) {
            assert!((*got as f64 - e / total).abs() < 1e-7);
        }
        assert!((dot(&orig, &orig) - orig.iter().map(|v| v * v).sum::<f32>()).abs() < 1e-3);
    }
}
