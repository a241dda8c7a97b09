//! Named policies: limit sets the operator defines once, in a rules file's
//! `policies:` section, and `CheckLimit` callers name instead of sending
//! parameters. `model` is what a policy is and how it is asked;
//! `file` reads the section.

pub(crate) mod file;
pub(crate) mod model;

pub(crate) use model::Policies;
pub use model::{LeaseBounds, Policy, PolicyLimit, Scope};
