//! DeepSeek-V2 and V3 (and the models built on them): Llama's pre-norms around multi-head latent
//! attention, whose shape comes from the config, with rope over each head's last part in GPT-J's
//! interleaved pairs; experts beside unscaled shared ones after the first dense layers, routed as
//! the config says (softmax or sigmoid scores, expert groups, the routed scaling factor).

use super::{llama::LLAMA, Assembly};
use rsgl_kernels::RopeStyle;

pub const DEEPSEEK: Assembly = Assembly { rope_style: RopeStyle::GptJ, ..LLAMA };
