"""Every contract number, defined once (TOOL_CONTRACT, REFERENCE_CONTRACT §3).

Code, tool descriptions and CLI help use these names; nothing else writes the numbers.
"""

from __future__ import annotations

from typing import Final

# ---- byte bounds (UTF-8 bytes after NFC) ----------------------------------------------------
MIB: Final = 1_048_576
MAX_ARGUMENT_BYTES: Final = MIB  # a tool call's canonical arguments
RESULT_BOUND: Final = MIB  # mirrors the argument bound: the largest result put on the wire
OPAQUE_MAX_BYTES: Final = 512  # opaque references, page cursors, purpose_ref
IDEMPOTENCY_KEY_MIN_BYTES: Final = 16
IDEMPOTENCY_KEY_MAX_BYTES: Final = 256
TEXT_MAX_BYTES: Final = 65_536  # a component's text
QUERY_MAX_BYTES: Final = 8_192
ATTESTATION_MAX_BYTES: Final = 4_096

# ---- search / get arguments -----------------------------------------------------------------
LIMIT_MIN: Final = 1
LIMIT_MAX: Final = 50
LIMIT_DEFAULT: Final = 10
PACKET_BYTES_MIN: Final = 4_096
PACKET_BYTES_MAX: Final = MIB
PACKET_BYTES_DEFAULT: Final = 65_536

# ---- capture arguments ----------------------------------------------------------------------
MAX_COMPONENTS: Final = 64
MAX_CITATIONS: Final = 256
MAX_FAMILY_REFS: Final = 64

# ---- confirmation gate (TOOL_CONTRACT §0) ---------------------------------------------------
CONFIRM_TTL_S: Final = 300  # a confirmation lives at most 300 s
EXECUTION_WINDOW_S: Final = 30  # the engine call must start within 30 s of the approval

# ---- retrieval ------------------------------------------------------------------------------
RRF_K: Final = 60  # the classic reciprocal-rank-fusion constant (Cormack et al. 2009)
CHANNEL_DEPTH: Final = 1000  # hits taken from each channel before fusion
# A record only the semantic channel found is shown only at this cosine or above, so a query
# like nothing stored answers []: chosen on the development collections (studies/fusion-study.md).
SEMANTIC_FLOOR: Final = 0.3
# Fusion across languages: the lexical channel's weight is scaled by min(1, coverage / this), the
# coverage being the share of the query's terms some record of the scope holds (in the best of the
# scope's languages). A question in another language than the memory's shares few words with it,
# and those few (names, numbers) would pull a good semantic ranking down (retrieval/ranking.py).
LEXICAL_COVERAGE_FULL: Final = 0.5
# Its mirror: the semantic channel's weight is multiplied by this when the query's identified
# language (retrieval/languages.py) is not one the store's embedding model was trained for
# (retrieval/embedder.py MODEL_LANGUAGES): the English MiniLM places an Arabic question near no
# paragraph of its own, and its noise would pull a good lexical ranking down (eval/RESULTS.md §13).
SEMANTIC_FOREIGN_SCALE: Final = 0.25
# The ranking's top RERANK_HEAD (hybrid or one channel) are reordered by who said a record and how
# its neighbours in event order scored (retrieval/rerank.py): head and weights chosen by rotation on
# LoCoMo (studies/rerank-study.md); both are inert on records without speaker labels or event order.
RERANK_HEAD: Final = 100
# A "Name:" label counts as a speaker only when it labels at least this many head records: a
# speaker says several things, while a document's "Vitamin D: ..." topic line labels one.
SPEAKER_MIN_RECORDS: Final = 3
RERANK_WEIGHTS: Final = (("neighbour", 1.0), ("speaker", 2.0))
# Only a conversation turn takes the stage's features, and a record is a turn only when its host
# says so: its primary_event.type_ref is one of the host's turn types (setting turn_types). A
# note's "Postgres: ..." line is a topic, not a speaker (issue 24: it moved answers down).
TURN_TYPES: Final = ("event:turn",)
# Exact (numpy) vector search below this many live vectors per scope, HNSW at or above it.
HNSW_THRESHOLD: Final = 50_000
# torch intra-op threads per encode: one lets concurrent searches run on separate cores
# (eval/RESULTS.md: two threads in a worker thread encode a query slower than one).
ENCODE_THREADS: Final = 1

# ---- time -----------------------------------------------------------------------------------
SECOND_MS: Final = 1000
DAY_MS: Final = 86_400_000
