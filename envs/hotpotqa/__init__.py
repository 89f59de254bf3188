"""trace/HotpotQA-v0: Search-R1-style multi-hop QA over a local retriever.

Modules: `env` (HotpotQAEnv, the protocol's episode logic), `protocol` (prompt, action
parsing, `<information>` format), `metrics` (official EM/F1), `data` (HotpotQA / wiki-18
loaders, bundled set), `retrievers` (BM25 and the common interface), `dense` (faiss +
sentence embeddings), `lucene` (pyserini), `remote` / `server` (HTTP /retrieve),
`scripted` (reference policies), `bench` (`trace-gym bench retrieval`).
See docs/hotpotqa.md.
"""
