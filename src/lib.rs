//! The HaltSQL operator, by role:
//! - [`api`]: the CRD types and their conditions;
//! - [`render`]: pure rendering of a server and its policies into objects;
//! - [`controllers`]: the two controllers and what they share (watches,
//!   context, backoff, status writes, metrics);
//! - [`manager`]: the process around them (flags, HTTP endpoints, leader
//!   election, logging, the offline `render` command);
//! - [`manifests`]: the CRDs and RBAC generated from the code.
pub mod api;
pub mod controllers;
pub mod manager;
pub mod manifests;
pub mod render;
