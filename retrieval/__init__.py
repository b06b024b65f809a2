"""Search projections: Tantivy BM25 (lexical), the packaged embedder, exact/HNSW vectors, fusion.

Modules are imported explicitly (``from retrieval.lexical import LexicalIndex``); this package
imports nothing heavy so that starting the MCP server stays fast.
"""
