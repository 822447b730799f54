//! The HaltSQLPolicy controller: validate each policy with the real
//! `haltsql validate` and report the `Valid` and `Synced` conditions.
//!
//! - [`validator`] runs the CLI in a private temporary directory with an
//!   empty environment, a timeout and bounded output, and caches verdicts by
//!   content.
//! - [`reconcile`](mod@reconcile) is one pass of the loop: reuse the verdict
//!   when generation and content are unchanged, otherwise judge the spec,
//!   derive `Synced` from the servers' `appliedPolicies`, and write the
//!   status only when it changed.
//! - [`ahead`] hands each judgement to the servers before the status write
//!   that reports it, and judges the policies ahead of their passes at
//!   start-up.

mod ahead;
mod reconcile;
pub mod validator;

pub use crate::controllers::judgement::Judgement;
pub use ahead::judge_ahead;
pub use reconcile::{
    Error, error_policy, invalid_spec, judge, policies_affected_by, policies_referenced_by,
    reconcile,
};
pub use validator::{Validator, Verdict, remove_stale_private_dirs};
