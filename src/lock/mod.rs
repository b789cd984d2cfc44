//! The lock middleware: [`LockLayer`] (built by a [`LockLayerBuilder`]) wraps a service in a
//! [`LockService`], whose [`ResponseFuture`] takes the request's lease and whose
//! [`LockedBody`] holds it until the response body ends.
//!
//! Every part is a thin tower shell over the framework-neutral
//! [`RequestLocker`](tower_lock_core::RequestLocker), which the actix-web integration
//! shares.

mod body;
mod builder;
mod future;
mod layer;
mod service;

pub use body::LockedBody;
pub use builder::LockLayerBuilder;
pub use future::ResponseFuture;
pub use layer::LockLayer;
pub use service::LockService;
