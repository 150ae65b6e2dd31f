//! How failures of the management API read: which of [`TopologyError`]'s kinds, naming
//! the endpoint (its password masked) and the action refused.

use rabbitmq_http_client::api::HttpClientError;

use super::ManagementEndpoint;
use crate::topology::error::TopologyError;

impl TopologyError {
    /// A request that got no answer.
    pub(super) fn unreachable(endpoint: &ManagementEndpoint, error: &reqwest::Error) -> Self {
        let reason = if error.is_timeout() {
            "it did not answer in time".to_string()
        } else if error.is_connect() {
            "the connection was refused or failed".to_string()
        } else {
            error.to_string()
        };
        TopologyError::Unreachable {
            endpoint: endpoint.to_string(),
            reason,
        }
    }

    pub(super) fn from_http(
        endpoint: &ManagementEndpoint,
        action: &str,
        e: HttpClientError,
    ) -> Self {
        match e {
            HttpClientError::RequestError { error, .. } => Self::unreachable(endpoint, &error),
            HttpClientError::ClientErrorResponse { status_code, .. }
                if status_code.as_u16() == 401 =>
            {
                TopologyError::Unauthorized {
                    endpoint: endpoint.to_string(),
                    user: endpoint.username.clone(),
                }
            }
            HttpClientError::ClientErrorResponse { status_code, .. }
                if status_code.as_u16() == 403 =>
            {
                TopologyError::Forbidden {
                    endpoint: endpoint.to_string(),
                    user: endpoint.username.clone(),
                    action: action.to_string(),
                }
            }
            HttpClientError::ClientErrorResponse {
                status_code,
                error_details,
                body,
                ..
            }
            | HttpClientError::ServerErrorResponse {
                status_code,
                error_details,
                body,
                ..
            } => {
                let reason = error_details
                    .as_ref()
                    .and_then(|d| d.reason().map(str::to_string))
                    .or(body)
                    .unwrap_or_default();
                TopologyError::Refused {
                    action: action.to_string(),
                    status: status_code.as_u16(),
                    reason,
                }
            }
            other => TopologyError::Refused {
                action: action.to_string(),
                status: 0,
                reason: other.to_string(),
            },
        }
    }
}
