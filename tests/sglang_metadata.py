"""Builds target-verify metadata the way SGLang's Triton attention backend does (eager and
CUDA-graph paths), from a request-to-token table, for the adapter tests."""

from dataclasses import dataclass

import torch

from ddtree_op.synthetic import DEEPSEEK_V3_SM_SCALE, random_tree_parents, tree_visibility


@dataclass
class SGLangVerifyInputs:
    q: torch.Tensor  # [T, H * 576], a view of a wider tensor
    k_buffer: torch.Tensor  # [S, 1, 576]
    v_buffer: torch.Tensor  # [S, 1, 512] view of the same rows
    qo_indptr: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor
    custom_mask: torch.Tensor
    mask_indptr: torch.Tensor
    out_cache_loc: torch.Tensor
    num_draft_tokens: int
    real_rows: int  # rows of real (not padding) requests
    sm_scale: float = DEEPSEEK_V3_SM_SCALE

    def as_verify_batch(self):
        """The same step in ddtree_op's terms, for the brute-force reference."""
        from types import SimpleNamespace

        heads = self.q.shape[1] // 576
        return SimpleNamespace(q=self.q.view(self.q.shape[0], heads, 576), kv_cache=self.k_buffer, qo_indptr=self.qo_indptr,
                               kv_indptr=self.kv_indptr, kv_indices=self.kv_indices, out_cache_loc=self.out_cache_loc,
                               tree_mask=self.custom_mask, mask_indptr=self.mask_indptr, mask_layout="full", sm_scale=self.sm_scale)


def build_target_verify(prefix_lens, num_draft, heads, *, cuda_graph=False, graph_bs=None, max_context_len=512,
                        device="cpu", dtype=torch.bfloat16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    bs = len(prefix_lens)
    bs_run = graph_bs if cuda_graph else bs  # CUDA-graph batches are padded to the captured size
    max_bs = 2 * bs_run
    pool_size = 4 * max_bs * max_context_len
    # The KV pool and the request-to-token table, slots scattered as an allocator leaves them.
    k_buffer = torch.randn(pool_size, 1, 576, generator=gen).to(dtype)
    slots = torch.randperm(pool_size, generator=gen)
    req_to_token = slots[: max_bs * max_context_len].view(max_bs, max_context_len).clone()
    req_pool_indices = torch.randperm(max_bs, generator=gen)[:bs]
    out_cache_loc = slots[max_bs * max_context_len : max_bs * max_context_len + bs * num_draft].clone()

    seq_lens = torch.tensor(prefix_lens, dtype=torch.int64)  # prefix only, as in TARGET_VERIFY
    if cuda_graph:  # padding requests: seq_len fill value 1, req pool index 0, drafts at slot 0
        seq_lens = torch.cat([seq_lens, torch.ones(bs_run - bs, dtype=torch.int64)])
        req_pool_indices = torch.cat([req_pool_indices, torch.zeros(bs_run - bs, dtype=torch.int64)])
        out_cache_loc = torch.cat([out_cache_loc, torch.zeros((bs_run - bs) * num_draft, dtype=torch.int64)])

    masks = []
    for b in range(bs):
        vis = tree_visibility(random_tree_parents(num_draft, gen))
        block = torch.ones(num_draft, prefix_lens[b] + num_draft, dtype=torch.bool)
        block[:, prefix_lens[b]:] = vis
        masks.append(block.reshape(-1))
    spec_custom_mask = torch.cat(masks)

    kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32)
    mask_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int64)
    kv_indptr_buf[1 : bs_run + 1] = torch.cumsum(seq_lens, 0).to(torch.int32)
    mask_indptr_buf[1 : bs_run + 1] = torch.cumsum(num_draft * (seq_lens + num_draft), 0)
    if cuda_graph:
        qo_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int64)
        qo_indptr_buf[: bs_run + 1] = torch.arange(0, (1 + bs_run) * num_draft, num_draft, dtype=torch.int32)
        qo_indptr = qo_indptr_buf[: bs_run + 1]
        kv_indices = torch.zeros(max_bs * num_draft * max_context_len, dtype=torch.int64)
        custom_mask = torch.zeros(max_bs * num_draft * max_context_len, dtype=torch.uint8)
        custom_mask[: spec_custom_mask.numel()] = spec_custom_mask
    else:
        qo_indptr = torch.arange(0, (1 + bs) * num_draft, num_draft, dtype=torch.int32)
        kv_indices = torch.empty(int(seq_lens.sum()), dtype=torch.int64)
        custom_mask = spec_custom_mask
    offset = 0
    for b in range(bs_run):
        kv_indices[offset : offset + seq_lens[b]] = req_to_token[req_pool_indices[b], : seq_lens[b]]
        offset += int(seq_lens[b])

    rows = bs_run * num_draft
    wide = torch.randn(rows, heads * 576 + 128, generator=gen).to(dtype)  # q is a view of a wider tensor
    dev = torch.device(device)
    k_buffer = k_buffer.to(dev)
    return SGLangVerifyInputs(
        q=wide.to(dev)[:, : heads * 576],
        k_buffer=k_buffer,
        v_buffer=k_buffer[..., :512],
        qo_indptr=qo_indptr.to(dev),
        kv_indptr=kv_indptr_buf[: bs_run + 1].to(dev),
        kv_indices=kv_indices.to(dev),
        custom_mask=custom_mask.to(dev),
        mask_indptr=mask_indptr_buf[: bs_run + 1].to(dev),
        out_cache_loc=out_cache_loc.to(dev),
        num_draft_tokens=num_draft,
        real_rows=bs * num_draft,
    )
