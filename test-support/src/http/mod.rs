//! HTTP fixtures: a test app on a real loopback socket (axum or actix) with a hyper-util
//! client, collected replies, and a streaming body fed from a channel.

mod body;
mod reply;
mod server;

pub use body::{ChannelBody, channel_body};
pub use reply::Reply;
pub use server::{TestServer, serve, serve_actix};
