//! `smollm3` (SmolLM3), after llama.cpp's `src/models/smollm3.cpp`: the llama layer, except
//! that every fourth layer (il + 1 divisible by 4) applies no rotary embedding (NoPE).

use crate::Result;
use crate::ffi::gguf::GgufFile;
use crate::hparams::Hparams;

/// llama.cpp's `n_no_rope_layer_step` for SmolLM3 (fixed there, not read from the file).
const NO_ROPE_LAYER_STEP: usize = 4;

pub(super) fn read_hparams(_f: &GgufFile, hp: &mut Hparams) -> Result<()> {
    hp.no_rope = (0..hp.n_layer).map(|il| (il + 1) % NO_ROPE_LAYER_STEP == 0).collect();
    Ok(())
}
