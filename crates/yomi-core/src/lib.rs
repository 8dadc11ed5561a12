//! yomi's shared vocabulary: the draft-tree batch every tree-aware op reads, and the
//! reference sampling math (position-seeded Gumbel-max) that makes seeded runs reproducible.

pub mod backend;
pub mod sampling;
pub mod shapes;
pub mod tree;

pub use sampling::{Sampler, SamplerParams, TOP_CANDIDATES, TopRow, TopRows};
pub use shapes::GdnShape;
pub use tree::TreeBatch;
