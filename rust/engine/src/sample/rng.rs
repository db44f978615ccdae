//! A small seeded generator (SplitMix64): reproducible per request, no global state.

#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The seed is mixed first: SplitMix64's state only advances by a constant, so raw seeds
    /// that differ by a multiple of it (or by one draw) would give the same stream shifted.
    pub fn new(seed: u64) -> Self {
        Rng(Rng(seed).next_u64())
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}
