//! The one matrix product the encoder needs, `y = x·Wᵀ + b`. A query is a few tokens: then each
//! weight row is read once and dotted with every token (the weights, 88 MB for MiniLM, are the
//! cost). A longer text (a tool definition) goes to `matrixmultiply`'s sgemm, which picks AVX2/FMA
//! or other SIMD kernels at run time and repays its packing of the weights. sgemm is the only
//! `unsafe` of the crate: it takes raw pointers and strides, so the shapes are checked first.

/// Up to this many rows, the row-by-row product; above, sgemm.
const SGEMM_FROM_ROWS: usize = 24;

/// `x` is `n × inputs`, `w` is `outputs × inputs` (PyTorch's `Linear` layout), `b` has `outputs`
/// values; the result is `n × outputs`, row-major.
pub fn linear(
    x: &[f32],
    n: usize,
    inputs: usize,
    w: &[f32],
    b: &[f32],
    outputs: usize,
) -> Vec<f32> {
    assert_eq!(x.len(), n * inputs, "x is n × inputs");
    assert_eq!(w.len(), outputs * inputs, "w is outputs × inputs");
    assert_eq!(b.len(), outputs, "b has outputs values");
    let mut y: Vec<f32> = Vec::with_capacity(n * outputs);
    for _ in 0..n {
        y.extend_from_slice(b);
    }
    if n == 0 || inputs == 0 || outputs == 0 {
        return y;
    }
    if n < SGEMM_FROM_ROWS {
        for (o, w_row) in w.chunks_exact(inputs).enumerate() {
            for (r, x_row) in x.chunks_exact(inputs).enumerate() {
                y[r * outputs + o] += dot(x_row, w_row);
            }
        }
        return y;
    }
    let (m, k, cols) = (n, inputs, outputs);
    let as_isize = |v: usize| isize::try_from(v).expect("matrix dimension fits isize");
    #[expect(
        unsafe_code,
        reason = "sgemm reads m×k from x (row stride k), k×cols from w transposed (column stride k) \
                  and writes m×cols to y (row stride cols): the lengths are asserted above"
    )]
    // SAFETY: x has m*k values read with strides (k, 1); w has cols*k values read as the k×cols
    // matrix Wᵀ with strides (1, k); y has m*cols values written with strides (cols, 1). Every
    // index sgemm forms lies inside its slice; the slices do not overlap (y is a fresh Vec).
    unsafe {
        matrixmultiply::sgemm(
            m,
            k,
            cols,
            1.0,
            x.as_ptr(),
            as_isize(k),
            1,
            w.as_ptr(),
            1,
            as_isize(k),
            1.0,
            y.as_mut_ptr(),
            as_isize(cols),
            1,
        );
    }
    y
}

/// Dot product in eight lanes (which the compiler vectorizes; one running sum would not be).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8
        .remainder()
        .iter()
        .zip(b8.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in a8.zip(b8) {
        for l in 0..8 {
            lanes[l] += x[l] * y[l];
        }
    }
    lanes.iter().sum::<f32>() + tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn linear_matches_a_plain_loop() {
        for n in [3, SGEMM_FROM_ROWS + 1] {
            linear_matches_a_plain_loop_with(n);
        }
    }

    fn linear_matches_a_plain_loop_with(n: usize) {
        let (inputs, outputs) = (13, 4);
        let x: Vec<f32> = (0..n * inputs).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..outputs * inputs)
            .map(|i| (i as f32 * 0.11).cos())
            .collect();
        let b: Vec<f32> = (0..outputs).map(|i| i as f32 * 0.5).collect();
        let y = linear(&x, n, inputs, &w, &b, outputs);
        for r in 0..n {
            for c in 0..outputs {
                let want: f32 = b[c]
                    + (0..inputs)
                        .map(|i| x[r * inputs + i] * w[c * inputs + i])
                        .sum::<f32>();
                assert!((y[r * outputs + c] - want).abs() < 1e-4);
            }
        }
        assert!(linear(&[], 0, inputs, &w, &b, outputs).is_empty());
    }
}
