//! `discard://`: accepts every mail and drops it, to measure the rest of the pipeline.

use std::fmt;

use futures::future::BoxFuture;

use super::{Provider, ProviderUrlError, SendError};
use crate::message::Mail;

/// Accepts every mail and sends none.
#[derive(Debug, Clone, Default)]
pub struct DiscardProvider;

impl DiscardProvider {
    /// Accepts `discard://` (or `discard:`) and nothing more.
    pub fn from_url(url: &url::Url) -> Result<Self, ProviderUrlError> {
        if url.has_host() || !matches!(url.path(), "" | "/") {
            return Err(ProviderUrlError::invalid(
                url,
                "discard:// takes no host or path",
            ));
        }
        super::refuse_query(url, &[])?;
        Ok(Self)
    }
}

impl fmt::Display for DiscardProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("discard://")
    }
}

impl Provider for DiscardProvider {
    fn send(&self, _mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async { Ok(()) })
    }
}
