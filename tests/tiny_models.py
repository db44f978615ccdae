"""The shape of the tiny random Llama-family models the tests build with transformers (offline)."""

TINY = dict(
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=256,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    # Larger than the usual 0.02 so logits are far apart and greedy choices are not coin flips.
    initializer_range=0.15,
    bos_token_id=1,
    eos_token_id=2,
)
