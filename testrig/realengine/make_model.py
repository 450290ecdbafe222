"""Write the tiny target model and its drafters, byte-for-byte the same on every run.

Run with the real-engine venv's python (transformers, tokenizers, safetensors live there), not
sparkctl's: ``python make_model.py OUT_DIR``. Writes OUT_DIR/target (Qwen2ForCausalLM, 2 layers),
OUT_DIR/drafter-eagle (Qwen2ForCausalLMEagle, 1 layer) and OUT_DIR/drafter-dflash (DFlashDraftModel,
1 layer). All share one byte-level BPE tokenizer trained here on generated sentences.

Why generated: no hub access here, and a seeded random model is enough to boot the real server and
exercise its API; its text is gibberish. Deterministic: seeded RNGs, one thread, files written
by us with sorted keys (the check is sha256 of every file across two builds).
"""
from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

SEED = 20261203
VOCAB = 512             # model vocab (the tokenizer uses fewer; the rest are never produced by it)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
WORDS = ("the a one every some spark node cluster model token server engine request answer worker rank "
         "fast slow small large quiet bright warm cold green blue red river stone cloud light sound "
         "runs reads writes sends waits starts stops grows moves learns counts builds finds keeps "
         "over under near after before with without into from across today tomorrow here there").split()


def corpus(n: int = 4000) -> list[str]:
    """Seeded sentences with digits, punctuation and a little chat framing, for BPE training."""
    rng = random.Random(SEED)
    lines = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 14))]
        words[0] = words[0].capitalize()
        tail = rng.choice([".", "!", "?", ", " + str(rng.randint(0, 999)) + "."])
        lines.append(" ".join(words) + tail if i % 7 else f"user: {' '.join(words)}?")
    return lines


def train_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=480, min_frequency=2, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    return tok


def write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def write_tokenizer(out: Path, tok: Tokenizer) -> None:
    tok.save(str(out / "tokenizer.json"), pretty=True)
    ids = {t: tok.token_to_id(t) for t in SPECIAL}
    write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1024, "clean_up_tokenization_spaces": False,
        "bos_token": None, "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "unk_token": None,
        "chat_template": CHATML, "added_tokens_decoder": {
            str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                     "single_word": False, "special": True} for t, i in ids.items()}})
    write_json(out / "special_tokens_map.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"})


def qwen2_config(tok: Tokenizer, layers: int, **extra) -> dict:
    eos, pad = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    return {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 256,
            "intermediate_size": 512, "num_hidden_layers": layers, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "vocab_size": VOCAB, "max_position_embeddings": 1024,
            "max_window_layers": layers, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
            "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
            "sliding_window": None, "attention_dropout": 0.0, "initializer_range": 0.02,
            "bos_token_id": pad, "eos_token_id": eos, "pad_token_id": pad, **extra}


def layer_weights(g: torch.Generator, prefix: str, *, input_norm: bool = True, qkv_bias: bool = True) -> dict:
    """One Qwen2 decoder layer's tensors (normal(0, 0.02) as transformers initialises, norms at 1)."""
    h, kv, inter = 256, 2 * 64, 512
    shapes: dict[str, tuple[int, ...]] = {"self_attn.q_proj.weight": (h, h), "self_attn.k_proj.weight": (kv, h),
              "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, h),
              "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter)}
    if qkv_bias:
        shapes |= {"self_attn.q_proj.bias": (h,), "self_attn.k_proj.bias": (kv,), "self_attn.v_proj.bias": (kv,)}
    out = {f"{prefix}{k}": normal(g, s) for k, s in shapes.items()}
    out[f"{prefix}post_attention_layernorm.weight"] = torch.ones(h)
    if input_norm:
        out[f"{prefix}input_layernorm.weight"] = torch.ones(h)
    return out


def normal(g: torch.Generator, shape: tuple) -> torch.Tensor:
    return torch.empty(shape).normal_(0.0, 0.02, generator=g)


def save_weights(out: Path, tensors: dict) -> None:
    bf16 = {k: v.to(torch.bfloat16).contiguous() for k, v in sorted(tensors.items())}
    save_file(bf16, str(out / "model.safetensors"), metadata={"format": "pt"})


def make_target(out: Path, tok: Tokenizer) -> None:
    g = torch.Generator().manual_seed(SEED)
    t = {"model.embed_tokens.weight": normal(g, (VOCAB, 256)), "model.norm.weight": torch.ones(256),
         "lm_head.weight": normal(g, (VOCAB, 256))}
    for i in range(2):
        t |= layer_weights(g, f"model.layers.{i}.")
    save_weights(out, t)
    cfg = qwen2_config(tok, 2)
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json",
               {"bos_token_id": cfg["bos_token_id"], "eos_token_id": cfg["eos_token_id"],
                "pad_token_id": cfg["pad_token_id"], "do_sample": False, "max_new_tokens": 64})


def make_eagle_drafter(out: Path, tok: Tokenizer) -> None:
    """EAGLE-1 layout SGLang's Qwen2ForCausalLMEagle loads: no 'model.' prefix, fc over [embed; hidden],
    no input_layernorm on layer 0, no final norm; lm_head and embeddings are taken from the target."""
    g = torch.Generator().manual_seed(SEED + 1)
    t = {"embed_tokens.weight": normal(g, (VOCAB, 256)), "fc.weight": normal(g, (256, 512)),
         "fc.bias": torch.zeros(256), "lm_head.weight": normal(g, (VOCAB, 256))}
    t |= layer_weights(g, "layers.0.", input_norm=False)
    save_weights(out, t)
    write_json(out / "config.json", qwen2_config(tok, 1, architectures=["Qwen2ForCausalLMEagle"]))


def make_dflash_drafter(out: Path, tok: Tokenizer) -> None:
    """DFLASH draft (SGLang's DFlashDraftModel): 1 layer reading the target's layers 0 and 1."""
    g = torch.Generator().manual_seed(SEED + 2)
    t = {"fc.weight": normal(g, (256, 2 * 256)), "hidden_norm.weight": torch.ones(256), "norm.weight": torch.ones(256)}
    t |= layer_weights(g, "layers.0.", qkv_bias=False)
    t |= {"layers.0.self_attn.q_norm.weight": torch.ones(64), "layers.0.self_attn.k_norm.weight": torch.ones(64)}
    save_weights(out, t)
    write_json(out / "config.json", qwen2_config(
        tok, 1, architectures=["DFlashDraftModel"], model_type="qwen3", block_size=4,
        dflash_config={"target_layer_ids": [0, 1], "mask_token_id": tok.token_to_id("<|endoftext|>")}))


def main(out: Path) -> None:
    torch.manual_seed(SEED)
    torch.set_num_threads(1)
    tok = train_tokenizer()
    for name, make in (("target", make_target), ("drafter-eagle", make_eagle_drafter),
                       ("drafter-dflash", make_dflash_drafter)):
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        write_tokenizer(d, tok)
        make(d, tok)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
