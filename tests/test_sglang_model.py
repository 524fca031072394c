"""The tiny DeepSeek-V3 verify step with SGLang's attention path in it: each layer's absorbed MLA
attention is SGLang's `RadixAttention` dispatching into `DDTreeTritonAttnBackend` over SGLang's
pool and TARGET_VERIFY metadata (an EAGLE tree from SGLang's tree build). The logits of every tree
node equal HF's logits for prompt + root-to-node path, eagerly and under
`torch.compile(fullgraph=True)` with no graph break. Skipped where sglang is not installed.

The rest of the model is transformers' (norms, projections, rotary embedding, MLP, head):
SGLang's own DeepseekV2 model class needs its process groups and fused CUDA kernels, so the
attention layer stack is what runs through SGLang here.
"""

import pytest
import torch

from sglang_runtime import sglang_skip_reason

_REASON = sglang_skip_reason()
pytestmark = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")

if _REASON is None:
    import sglang_runtime as sr
    from hf_mla_verify import TreeVerifier, tiny_deepseek_v3
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from ddtree_op.integrations.sglang import DDTreeTritonAttnBackend

    class SGLangTreeVerifier(TreeVerifier):
        """TreeVerifier whose attention goes through SGLang's RadixAttention and the backend."""

        def __init__(self, model, rt):
            super().__init__(model, 1)  # its own pool is unused: SGLang's MLATokenToKVPool holds the KV
            self.rt = rt
            self.attn_layers = [sr.radix_attention(self.heads, i) for i in range(model.config.num_hidden_layers)]
            for radix, hf_layer in zip(self.attn_layers, model.model.layers):
                radix.scaling = hf_layer.self_attn.scaling

        @torch.no_grad()
        def prefill_into_pool(self, prompt, slots):
            hidden = self.model(prompt[None], output_hidden_states=True).hidden_states
            cos, sin = self.model.model.rotary_emb(hidden[0], torch.arange(prompt.numel())[None])
            for i, layer in enumerate(self.model.model.layers):
                rows, _ = self._latents_and_queries(i, layer.self_attn, layer.input_layernorm(hidden[i]), cos, sin)
                self.rt.kv_pool.kv_buffer[i][slots, 0] = rows.to(self.rt.dtype)

        @torch.no_grad()
        def forward(self, draft_ids, positions, forward_batch):
            hidden = self.model.model.embed_tokens(draft_ids)[None]
            cos, sin = self.model.model.rotary_emb(hidden, positions[None])
            tokens = draft_ids.numel()
            for i, layer in enumerate(self.model.model.layers):
                attn = layer.self_attn
                rows, queries = self._latents_and_queries(i, attn, layer.input_layernorm(hidden), cos, sin)
                k = rows.to(self.rt.dtype)[:, None]
                latent = self.attn_layers[i](queries.to(self.rt.dtype).reshape(tokens, -1), k, k[..., :512], forward_batch)
                attn_out = torch.einsum("thc,hvc->thv", latent.view(tokens, self.heads, 512).float(), getattr(self, f"w_uv_{i}"))
                hidden = hidden + attn.o_proj(attn_out.reshape(1, tokens, -1))
                hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
            return self.model.lm_head(self.model.model.norm(hidden))[0]


def per_path_logits(model, prompts, step):
    """HF's logits at the last token of prompt + root-to-node path, read off SGLang's FULL mask."""
    n, rows, offset = step.num_draft, [], 0
    with torch.no_grad():
        for b, prompt in enumerate(prompts):
            width = prompt.numel() + n
            ancestors = step.tree.custom_mask[offset : offset + n * width].view(n, width)[:, prompt.numel():]
            offset += n * width
            ids = step.tree.draft_tokens[b * n : (b + 1) * n]
            for j in range(n):
                rows.append(model(torch.cat([prompt, ids[ancestors[j]]])[None]).logits[0, -1].float())
    return torch.stack(rows)


def rel_err(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def test_verify_step_through_sglang_attention_compiles_and_matches_per_path():
    topk, steps, n = 4, 3, 8
    model = tiny_deepseek_v3()
    with sr.spec_config(topk, steps, n):
        rt = sr.make_runtime(n, heads=model.config.num_attention_heads, dtype=torch.float16)
        backend = DDTreeTritonAttnBackend(rt.runner)
        prompt_lens = [9, 21]
        step = sr.verify_step(rt, prompt_lens, topk, steps, n, seed=1, layer_ids=())
        gen = torch.Generator().manual_seed(0)
        prompts = [torch.randint(0, model.config.vocab_size, (p,), generator=gen) for p in prompt_lens]
        verifier = SGLangTreeVerifier(model, rt)
        for prompt, slots in zip(prompts, step.prefix_slots):
            verifier.prefill_into_pool(prompt, slots)
        backend.init_forward_metadata(step.forward_batch)
        args = (step.tree.draft_tokens, step.tree.positions, step.forward_batch)
        with forward_context(ForwardContext(attn_backend=backend), forward_batch=step.forward_batch):
            want = per_path_logits(model, prompts, step)
            eager = verifier(*args)
            assert rel_err(eager, want) < 1e-2
            explanation = torch._dynamo.explain(verifier)(*args)
            assert explanation.graph_break_count == 0 and explanation.graph_count == 1, explanation.break_reasons
            torch._dynamo.reset()
            compiled = torch.compile(verifier, backend="aot_eager", fullgraph=True)(*args)
        assert rel_err(compiled, want) < 1e-2
        assert rel_err(compiled, eager) < 1e-3
