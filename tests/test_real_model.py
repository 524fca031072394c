"""End to end through a real MLA model (transformers' DeepSeek-V3, tiny random config): the
logits of every tree node from one verify step equal HF's logits for prompt + root-to-node path."""

import pytest
import torch

from conftest import needs_cuda
from ddtree_op.synthetic import random_tree_parents, tree_visibility

pytest.importorskip("transformers", reason="transformers is needed for the real-model test")
from hf_mla_verify import TreeVerifier, tiny_deepseek_v3  # noqa: E402

NUM_SLOTS = 600
MAX_DRAFT = 8


def make_step(vocab, prompt_lens, draft_lens, seed, device, all_visible=False):
    """A batch of requests: prompts, random trees of draft tokens, scattered slots, FULL mask."""
    gen = torch.Generator().manual_seed(seed)
    slots = torch.randperm(NUM_SLOTS, generator=gen)
    prompts, paths, prefix_slots, draft_slots, mask_blocks, positions, draft_ids = [], [], [], [], [], [], []
    used = 0
    for prompt_len, n in zip(prompt_lens, draft_lens):
        prompts.append(torch.randint(0, vocab, (prompt_len,), generator=gen))
        prefix_slots.append(slots[used : used + prompt_len])
        used += prompt_len
        draft_slots.append(slots[used : used + n])
        used += n
        parents = random_tree_parents(n, gen)
        tokens = torch.randint(0, vocab, (n,), generator=gen)
        vis = torch.ones(n, n, dtype=torch.bool) if all_visible else tree_visibility(parents)
        block = torch.ones(n, prompt_len + n, dtype=torch.bool)
        block[:, prompt_len:] = vis
        mask_blocks.append(block.reshape(-1))
        depth = tree_visibility(parents).sum(1) - 1  # ancestors of each node
        positions.append(prompt_len + depth)
        draft_ids.append(tokens)
        paths.append([tokens[tree_visibility(parents)[i]] for i in range(n)])  # root-to-node tokens
    to = dict(device=device)
    step = dict(
        draft_ids=torch.cat(draft_ids).to(**to),
        positions=torch.cat(positions).to(**to),
        qo_indptr=torch.tensor([0] + list(draft_lens)).cumsum(0).to(torch.int32).to(**to),
        kv_indptr=torch.tensor([0] + list(prompt_lens)).cumsum(0).to(torch.int32).to(**to),
        kv_indices=torch.cat(prefix_slots).to(**to),
        out_cache_loc=torch.cat(draft_slots).to(**to),
        tree_mask=torch.cat(mask_blocks).to(**to),
        mask_indptr=torch.tensor([0] + [n * (p + n) for p, n in zip(prompt_lens, draft_lens)]).cumsum(0).to(**to),
    )
    return step, prompts, paths, prefix_slots


def hf_logits(model, prompts, paths):
    """HF's logits at the last token of prompt + path, for every node of every request."""
    rows = []
    with torch.no_grad():
        for prompt, request_paths in zip(prompts, paths):
            for path in request_paths:
                ids = torch.cat([prompt, path]).to(model.device)[None]
                rows.append(model(ids).logits[0, -1].float())
    return torch.stack(rows)


def relative_error(a, b):
    return float((a.double() - b.double()).norm() / b.double().norm())


def run_verify(verifier, step, prompts, prefix_slots, fn=None):
    for prompt, slots in zip(prompts, prefix_slots):
        verifier.prefill(prompt.to(verifier.kv_pool.device), slots.to(verifier.kv_pool.device))
    return (verifier if fn is None else fn)(**step, max_draft_len=MAX_DRAFT)


@pytest.fixture(scope="module")
def model():
    return tiny_deepseek_v3()


def test_tree_logits_match_hf_per_path(model):
    verifier = TreeVerifier(model, NUM_SLOTS)
    step, prompts, paths, prefix_slots = make_step(model.config.vocab_size, [9, 21], [6, 8], seed=1, device="cpu")
    logits = run_verify(verifier, step, prompts, prefix_slots)
    want = hf_logits(model, prompts, paths)
    assert relative_error(logits, want) < 1e-2
    # The check can fail: letting every draft see every other draft changes the logits.
    wrong, *_ = make_step(model.config.vocab_size, [9, 21], [6, 8], seed=1, device="cpu", all_visible=True)
    assert relative_error(run_verify(verifier, wrong, prompts, prefix_slots), want) > 5e-2


def test_whole_step_compiles_fullgraph(model):
    from torch._dynamo.testing import CompileCounterWithBackend

    torch._dynamo.reset()
    verifier = TreeVerifier(model, NUM_SLOTS)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(verifier, backend=counter, fullgraph=True)
    step, prompts, paths, prefix_slots = make_step(model.config.vocab_size, [12, 5], [7, 4], seed=2, device="cpu")
    logits = run_verify(verifier, step, prompts, prefix_slots, fn=compiled)
    assert counter.frame_count == 1
    assert relative_error(logits, hf_logits(model, prompts, paths)) < 1e-2


@needs_cuda
def test_cuda_graph_replays_two_trees_and_prefix_lengths():
    model = tiny_deepseek_v3().cuda()
    verifier = TreeVerifier(model, NUM_SLOTS)
    vocab, draft_lens = model.config.vocab_size, [8, 5]
    first, prompts, paths, prefix_slots = make_step(vocab, [30, 11], draft_lens, seed=3, device="cuda")
    # Static buffers as a serving engine keeps them: sized for the largest prefix and mask.
    static = {k: v.clone() for k, v in first.items()}
    static["kv_indices"] = torch.zeros(400, dtype=first["kv_indices"].dtype, device="cuda")
    static["tree_mask"] = torch.zeros(4000, dtype=torch.bool, device="cuda")

    def load(step):
        for name, value in step.items():
            static[name].view(-1)[: value.numel()].copy_(value.view(-1))

    load(first)
    run_verify(verifier, static, prompts, prefix_slots)  # warm-up: builds kernels
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = verifier(**static, max_draft_len=MAX_DRAFT)
    for seed, prompt_lens in [(4, [40, 7]), (5, [13, 60])]:
        step, prompts, paths, prefix_slots = make_step(vocab, prompt_lens, draft_lens, seed=seed, device="cuda")
        for prompt, slots in zip(prompts, prefix_slots):
            verifier.prefill(prompt.cuda(), slots.cuda())
        load(step)
        logits.fill_(float("nan"))
        graph.replay()
        assert relative_error(logits, hf_logits(model, prompts, paths)) < 1e-2
