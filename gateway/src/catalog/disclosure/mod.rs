//! Progressive disclosure, the gateway's side: which of the page's Gate-A-visible tools answer a
//! request best (`find_tools`), by the lexical order the database gives fused with embeddings.
//!
//! - [`semantic`]: embeddings of tool definitions (cached by a hash of the definition) and of
//!   queries, from a model directory (offline, the default) or a provider's `/v1/embeddings`.
//! - [`fusion`]: cosine first, the lexical order as tie-break, in passes that keep the DBA's
//!   matching tools ahead (an upstream tool never takes a matching local tool's place).
//!
//! The ranker only orders the candidates it is given (the tools the database returned as visible
//! for the context): it never adds one.

pub mod fusion;
pub mod semantic;

pub use fusion::{fuse, Fused, FIND_COSINE, MATCH_COSINE, UPSTREAM_COSINE};
pub use semantic::{definition_text, Embeddings, Ranker};
