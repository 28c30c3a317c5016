//! Every kernel against ggml's one-row kernel, element by element, bit for bit.

use llama_cpp_sys_2 as sys;

use super::*;

use super::timing::{one_row_dot as vec_dot, random_operands};

/// [`random_operands`], with extremes a file may hold: a weight of −128 in every third Q8_0
/// block (ggml's quantizer never writes one, ggml's sign trick wraps it, and ours must wrap
/// it alike), and for the K-quants every third weight super-block at its largest values and
/// scales against every other activation super-block at −128 (where the x86 kernels' 16-bit
/// sums of four products come nearest to overflowing).
fn data(quant: Quant, rows: usize, cols: usize, k: usize, seed: u64) -> (Vec<u64>, Vec<u64>) {
    let (mut w, mut y) = random_operands(quant, rows, cols, k, seed);
    let (w_bytes, y_bytes) = (bytes_of(&mut w), bytes_of(&mut y));
    match quant {
        Quant::Q8_0 => {
            for b in (0..rows * k / 32).step_by(3) {
                w_bytes[b * 34 + 2 + b % 32] = 0x80;
            }
        }
        Quant::Q4K | Quant::Q6K => {
            let size = if quant == Quant::Q4K {
                size_of::<blocks::BlockQ4K>()
            } else {
                size_of::<blocks::BlockQ6K>()
            };
            for b in (0..rows * k / 256).step_by(3) {
                let block = &mut w_bytes[b * size..(b + 1) * size];
                if quant == Quant::Q4K {
                    // The packed 6-bit scales and mins (all 63), then the nibbles (all 15).
                    block[4..].fill(0xFF);
                } else {
                    // The low and high bits (all weights 63), then the scales (all −128).
                    block[..192].fill(0xFF);
                    block[192..208].fill(0x80);
                }
            }
            let size = size_of::<blocks::BlockQ8K>();
            for b in (0..cols * k / 256).step_by(2) {
                let block = &mut y_bytes[b * size..(b + 1) * size];
                // After the f32 scale, 256 activations of −128 and their 16 sums.
                block[4..260].fill(0x80);
                for sum in block[260..292].chunks_exact_mut(2) {
                    sum.copy_from_slice(&(-128i16 * 16).to_le_bytes());
                }
            }
        }
        _ => {}
    }
    (w, y)
}

/// The bytes of 8-byte words.
fn bytes_of(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: any bytes are valid u8; the length covers the same memory.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

/// The instruction sets this CPU can run that sum as this ggml does: the one chosen, and the
/// others below it.
#[cfg(target_arch = "x86_64")]
fn isas() -> Vec<Isa> {
    let Some(best) = detect() else { return Vec::new() };
    let mut all = vec![best];
    if best == Isa::Avx512 && is_x86_feature_detected!("avxvnni") {
        all.push(Isa::AvxVnni);
    }
    all.push(Isa::Avx2);
    all.dedup();
    all
}

/// On ARM the lanes are fixed by how ggml was built: for a plain NEON ggml, both the
/// permuted `sdot` kernels (where the CPU has `sdot`) and the widening-multiply ones.
#[cfg(target_arch = "aarch64")]
fn isas() -> Vec<Isa> {
    match detect() {
        Some(Isa::NeonPermuted) => vec![Isa::NeonPermuted, Isa::Neon],
        other => other.into_iter().collect(),
    }
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn isas() -> Vec<Isa> {
    Vec::new()
}

#[test]
fn f16_conversion_is_exact() {
    crate::ffi::init();
    for h in 0..=u16::MAX {
        // SAFETY: a pure conversion.
        let want = unsafe { sys::ggml_fp16_to_fp32(h) };
        let got = blocks::f16_to_f32(h);
        assert!(
            got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
            "{h:#06x}: {got} vs {want}"
        );
    }
}

#[test]
fn block_layouts_are_ggml_s() {
    crate::ffi::init();
    let sizes = [
        (Quant::Q4_0, size_of::<blocks::BlockQ4_0>()),
        (Quant::Q5_0, size_of::<blocks::BlockQ5_0>()),
        (Quant::Q8_0, size_of::<blocks::BlockQ8_0>()),
        (Quant::Q4_1, size_of::<blocks::BlockQ4_1>()),
        (Quant::Q4K, size_of::<blocks::BlockQ4K>()),
        (Quant::Q6K, size_of::<blocks::BlockQ6K>()),
    ];
    for (quant, size) in sizes {
        // SAFETY: pure functions of a type.
        unsafe {
            assert_eq!(size, sys::ggml_type_size(quant.ggml()), "{quant:?}");
            assert_eq!(quant.block_len() as i64, sys::ggml_blck_size(quant.ggml()), "{quant:?}");
            assert_eq!(
                quant.activations(),
                (*sys::ggml_get_type_traits_cpu(quant.ggml())).vec_dot_type,
                "{quant:?}"
            );
        }
    }
    // SAFETY: as above.
    unsafe { assert_eq!(size_of::<blocks::BlockQ8K>(), sys::ggml_type_size(sys::GGML_TYPE_Q8_K)) };
}

#[test]
fn every_element_is_what_the_one_row_kernel_computes() {
    crate::ffi::init();
    if isa().is_none() {
        return;
    }
    // Every tile width and remainder, odd and even weight rows, one column and many.
    let mut compared = 0;
    let shapes = [(64, 1), (37, 9), (16, 17), (5, 8), (8, 3), (6, 7), (3, 5), (4, 2), (9, 33)];
    for quant in Quant::ALL {
        for (i, &(rows, cols)) in shapes.iter().enumerate() {
            let k = quant.block_len() * [1, 3, 18, 7][i % 4];
            let (w, y) = data(quant, rows, cols, k, (rows * 31 + cols) as u64);
            for isa in isas() {
                let mut out = vec![f32::NAN; cols * rows];
                // Weight rows in two calls, as two threads split them.
                let split = rows / 2;
                for range in [0..split, split..rows] {
                    let call = Rows { w: w.as_ptr().cast(), y: y.as_ptr().cast(), k, n: cols, range };
                    // SAFETY: an instruction set this CPU has; sizes as documented.
                    unsafe { gemm(isa, quant, call, out.as_mut_ptr(), rows, &mut Work::default()) };
                }
                for c in 0..cols {
                    for r in 0..rows {
                        let want = vec_dot(quant, &w, &y, k, r, c);
                        let got = out[c * rows + r];
                        assert_eq!(
                            got.to_bits(),
                            want.to_bits(),
                            "{quant:?} on {isa:?}: row {r} col {c} of {rows}x{cols}x{k}: {got} vs {want}"
                        );
                        compared += 1;
                    }
                }
            }
        }
    }
    eprintln!("{compared} elements compared on {:?}", isas());
}

#[test]
fn every_format_agrees_with_this_ggml_at_start() {
    crate::ffi::init();
    if isa().is_none() {
        return;
    }
    for quant in Quant::ALL {
        assert!(verified(quant), "{quant:?}: the start-up probe found our kernel rounding unlike ggml's");
    }
    assert!(name().is_some_and(|n| Quant::ALL.iter().all(|q| n.contains(q.name()))), "{:?}", name());
}

/// Q4_K repacked by ggml (x86 with AVX2): every element of our several-token kernel, with
/// each instruction set this CPU has, is what ggml's one-token kernel on that layout computes,
/// at the extremes too, for every tile width and across blocks of tokens, with the rows split
/// between calls as threads split them.
#[cfg(target_arch = "x86_64")]
#[test]
fn repacked_q4_k_is_what_ggml_s_gemv_computes() {
    crate::ffi::init();
    let Some(buft) = repacked::buffer_type() else {
        assert!(
            isa().is_none() || crate::ffi::device::cpu_repack_buffer_type().is_none(),
            "the start-up probe found our repacked Q4_K kernel rounding unlike ggml's gemv"
        );
        return;
    };
    let mut compared = 0;
    let shapes = [(8, 2), (16, 5), (32, 9), (24, 1), (16, 70), (40, 4), (8, 7), (16, 8), (24, 15), (8, 131)];
    for (i, &(rows, cols)) in shapes.iter().enumerate() {
        let k = 256 * [1, 3, 7, 2][i % 4];
        let (w, y) = data(Quant::Q4K, rows, cols, k, (rows * 31 + cols) as u64);
        let split = (rows / 16) * 8;
        for isa in isas() {
            let (gemv, ours) =
                repacked::both(isa, buft, &w, &y, (rows, cols, k), split).expect("ggml repacks");
            for (at, (want, got)) in gemv.iter().zip(&ours).enumerate() {
                let (c, r) = (at / rows, at % rows);
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{isa:?}: row {r} col {c} of {rows}x{cols}x{k}: {got} vs {want}"
                );
                compared += 1;
            }
        }
    }
    eprintln!("{compared} elements compared");
    assert!(name().is_some_and(|n| n.contains("q4_Kx8")), "{:?}", name());
}
