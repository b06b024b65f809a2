"""Offline relevance and performance harness: BEIR collections through the real engine.

Modules: ``beir`` (loader and subsets), ``ingest`` (capture + admission as the host, with a
content-keyed store cache), ``runner`` (queries through the real search path), ``metrics``
(ranx), ``report`` (results.json / report.md / report.png), ``peer_lancedb`` (the optional
LanceDB side-by-side), ``bench`` (latency and throughput), ``tune`` (fusion grid), ``cli``.
"""
