//! `ses://ACCESS_KEY_ID:SECRET_ACCESS_KEY@REGION`: Amazon SES v2 `SendEmail`
//! (`POST /v2/email/outbound-emails`), signed with SigV4 (service `ses`).
//!
//! The mail goes as SES's raw content: the MIME message the mailer renders for SMTP, so
//! every header (Message-ID, Reply-To, the extra headers) reaches SES as it is, with the
//! sender and the `To`, `Cc` and `Bcc` recipients as the request's `FromEmailAddress`
//! and `Destination`. Options: `configuration-set=NAME` (the request's
//! `ConfigurationSetName`) and `endpoint=URL`.

use std::fmt;
use std::io::Write;
use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_sigv4::http_request::{SignableBody, SignableRequest, SigningSettings, sign};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use futures::future::BoxFuture;
use serde_json::{Map, Value, json};
use url::Url;

use super::{Api, Said};
use crate::message::Mail;
use crate::provider::{ErrorClass, Provider, ProviderUrlError, SendError};

/// The path of SES v2's `SendEmail`.
pub const PATH: &str = "/v2/email/outbound-emails";
/// The service name SigV4 signs for.
pub const SIGNING_NAME: &str = "ses";

/// Sends mail through SES v2 in one region.
pub struct SesProvider {
    api: Api,
    region: String,
    url: Url,
    identity: Identity,
    configuration_set: Option<String>,
}

impl SesProvider {
    pub fn from_url(url: &Url, ca_pem: Option<&[u8]>) -> Result<Self, ProviderUrlError> {
        super::refuse_query(url, &["endpoint", "configuration-set"])?;
        let region = url.host_str().unwrap_or_default().to_string();
        let valid_region = !region.is_empty()
            && region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if !valid_region {
            return Err(super::invalid(
                url,
                "the host must be the AWS region, e.g. ses://KEY_ID:SECRET@eu-west-1",
            ));
        }
        if !matches!(url.path(), "" | "/") || url.port().is_some() {
            return Err(super::invalid(url, "ses:// takes no port or path"));
        }
        let (key_id, _) = crate::redact::credentials(url);
        if key_id.is_empty() {
            return Err(super::invalid(
                url,
                "the access key id is missing: ses://ACCESS_KEY_ID:SECRET_ACCESS_KEY@REGION",
            ));
        }
        let secret = super::key(url, "secret access key")?;
        let default_base = format!("https://email.{region}.amazonaws.com");
        let endpoint = super::endpoint(url, &default_base, PATH)?;
        let identity = Credentials::new(key_id, secret, None, None, "mailer-provider-url").into();
        Ok(Self {
            api: Api::new(url, format!("ses://{region}"), ca_pem)?,
            url: endpoint,
            region,
            identity,
            configuration_set: super::option(url, "configuration-set"),
        })
    }

    /// The request's JSON: the sender, the recipients and the raw message.
    fn request_body(&self, mail: Mail) -> Result<Vec<u8>, SendError> {
        let from = mail.from().email.to_string();
        let mut destination = Map::new();
        let lists = ["ToAddresses", "CcAddresses", "BccAddresses"];
        for (list, mailboxes) in lists.into_iter().zip(mail.recipients()) {
            if !mailboxes.is_empty() {
                let addresses = mailboxes
                    .iter()
                    .map(|m| Value::String(m.email.to_string()))
                    .collect();
                destination.insert(list.to_string(), Value::Array(addresses));
            }
        }
        let mut head = json!({ "FromEmailAddress": from, "Destination": destination });
        if let (Some(set), Some(fields)) = (&self.configuration_set, head.as_object_mut()) {
            fields.insert("ConfigurationSetName".into(), Value::String(set.clone()));
        }
        let failed = |e: &dyn fmt::Display| {
            SendError::for_good(ErrorClass::Protocol, format!("{self}: {e}")).not_reached()
        };
        let mut body = serde_json::to_vec(&head).map_err(|e| failed(&e))?;
        // The raw message is encoded straight into the body from the rendered pieces, so
        // a large mail is held as its rendering and the body only, not copied twice more.
        if body.pop() != Some(b'}') {
            return Err(failed(&"the request's JSON is no object"));
        }
        let rendered = mail
            .render()
            .map_err(|e| crate::provider::unrenderable(self, &e))?;
        let size = rendered.size();
        body.reserve(size.div_ceil(3) * 4 + 40);
        body.extend_from_slice(br#","Content":{"Raw":{"Data":""#);
        let mut encoder =
            base64::write::EncoderWriter::new(body, &base64::engine::general_purpose::STANDARD);
        for piece in rendered.parts() {
            encoder.write_all(&piece).map_err(|e| failed(&e))?;
        }
        let mut body = encoder.finish().map_err(|e| failed(&e))?;
        body.extend_from_slice(br#""}}}"#);
        Ok(body)
    }

    /// The SigV4 headers (`x-amz-date`, `authorization`) of a request with `body`,
    /// signed at `time`.
    fn signature(
        &self,
        body: &[u8],
        time: SystemTime,
    ) -> Result<Vec<(&'static str, String)>, SendError> {
        let failed = |e: &dyn fmt::Display| {
            SendError::for_now(ErrorClass::Protocol, format!("{self}: cannot sign: {e}"))
                .not_reached()
        };
        let params = v4::SigningParams::builder()
            .identity(&self.identity)
            .region(&self.region)
            .name(SIGNING_NAME)
            .time(time)
            .settings(SigningSettings::default())
            .build()
            .map_err(|e| failed(&e))?
            .into();
        let headers = [("content-type", "application/json")];
        let signable = SignableRequest::new(
            "POST",
            self.url.as_str(),
            headers.into_iter(),
            SignableBody::Bytes(body),
        )
        .map_err(|e| failed(&e))?;
        let (instructions, _) = sign(signable, &params)
            .map_err(|e| failed(&e))?
            .into_parts();
        let (headers, _) = instructions.into_parts();
        Ok(headers
            .into_iter()
            .map(|h| (h.name(), h.value().to_string()))
            .collect())
    }
}

/// SES's error body: `{"message": "..."}`, and its type in `x-amzn-ErrorType`. Its
/// account-wide refusals (sending paused, account suspended) fail for now: they are
/// lifted without the mail changing.
fn read(headers: &reqwest::header::HeaderMap, body: &[u8]) -> Said {
    let kind = headers
        .get("x-amzn-errortype")
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(':').next().unwrap_or_default().to_string());
    let message = super::json_field(body, "message").or_else(|| super::json_field(body, "Message"));
    let class = match kind.as_deref() {
        Some("SendingPausedException" | "AccountSuspendedException") => {
            Some(ErrorClass::TemporaryReply)
        }
        _ => None,
    };
    let reason = match (kind, message) {
        (Some(kind), Some(message)) => Some(format!("{kind}: {message}")),
        (kind, message) => message.or(kind),
    };
    Said { reason, class }
}

impl fmt::Display for SesProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ses://{}", self.region)
    }
}

impl fmt::Debug for SesProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SesProvider")
            .field("region", &self.region)
            .field("url", &self.url.as_str())
            .field("configuration_set", &self.configuration_set)
            .finish_non_exhaustive()
    }
}

impl Provider for SesProvider {
    fn send(&self, mail: Mail) -> BoxFuture<'_, Result<(), SendError>> {
        Box::pin(async move {
            self.api.gate()?;
            let body = self.request_body(mail)?;
            let signature = self.signature(&body, SystemTime::now())?;
            let mut request = self
                .api
                .client()
                .post(self.url.clone())
                .header(reqwest::header::CONTENT_TYPE, "application/json");
            for (name, value) in signature {
                request = request.header(name, value);
            }
            self.api.outcome(request.body(body), read).await
        })
    }

    fn paused(&self) -> Option<crate::provider::Pause> {
        self.api.paused()
    }
}
