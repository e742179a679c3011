//! The tool catalog as the gateway sees it.

pub mod compact;
pub mod disclosure;
