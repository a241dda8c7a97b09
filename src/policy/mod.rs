//! Named policies: limit sets the operator defines once, in a rules file's
//! `policies:` section, and `CheckLimit` callers name instead of sending
//! parameters. [`model`] is what a policy is and how it is asked;
//! [`file`](mod@file) reads the section.

pub mod file;
pub mod model;

pub use model::{Policies, Policy, PolicyLimit, Scope, algorithm};
