//! Many policies of one vhost written in one request: a definitions import that holds
//! only them. RabbitMQ takes policy PUTs slowly whatever the concurrency, and imports
//! many policies at once far sooner (`docs/benchmarks.md`), so a first apply of many
//! pipelines, whose policies all go before any exchange or queue, is faster this way. An
//! import sets each policy it holds as a PUT would (created, or replaced when it
//! differs); it needs the administrator tag, so without it the policies are PUT one by
//! one.

use serde_json::{Value, json};

use super::desired::{POLICY_PRIORITY, Policy};
use super::diff::Change;
use super::error::TopologyError;
use super::management::Management;

/// From this many policies to write in one vhost in one pass, they are imported in one
/// request (8 pipelines' worth) rather than PUT one by one.
pub const POLICY_IMPORT_FROM: usize = 24;

/// The most policies one import holds. RabbitMQ 4.0 sets each imported policy in time
/// that grows with the policies the vhost already has, so one import of a few thousand
/// comes close to the client's 30 s deadline (`docs/benchmarks.md`). Parts of this size
/// keep each request well within it.
pub const POLICY_IMPORT_PART: usize = 250;

impl Management {
    /// Writes `policies` into `vhost` by definitions imports of at most
    /// [`POLICY_IMPORT_PART`] each. `Ok(false)`, with nothing written, when this user may
    /// not import definitions.
    pub async fn import_policies(
        &self,
        vhost: &str,
        policies: &[&Policy],
    ) -> Result<bool, TopologyError> {
        for (n, part) in policies.chunks(POLICY_IMPORT_PART).enumerate() {
            let definitions = policy_definitions(part);
            match self
                .bounded_write(self.api.import_vhost_definitions(vhost, definitions))
                .await
            {
                Ok(()) => {}
                Err(e)
                    if n == 0 && matches!(e.status_code().map(|s| s.as_u16()), Some(401 | 403)) =>
                {
                    return Ok(false);
                }
                Err(e) => {
                    // Some may have been set all the same.
                    self.wrote_to(vhost);
                    return Err(self.error(
                        &format!(
                            "import {} policies into vhost {vhost:?} (part {} of {})",
                            part.len(),
                            n + 1,
                            policies.len().div_ceil(POLICY_IMPORT_PART)
                        ),
                        e,
                    ));
                }
            }
        }
        let made: Vec<Change> = policies
            .iter()
            .map(|policy| Change::PutPolicy {
                policy: (*policy).clone(),
                previous: None,
            })
            .collect();
        self.made(vhost, &made);
        Ok(true)
    }
}

/// A vhost's definitions document with `policies` alone, as a PUT of each would set them.
fn policy_definitions(policies: &[&Policy]) -> Value {
    let policies: Vec<Value> = policies
        .iter()
        .map(|policy| {
            json!({
                "name": policy.name,
                "pattern": policy.pattern,
                "apply-to": "queues",
                "priority": POLICY_PRIORITY,
                "definition": policy.definition,
            })
        })
        .collect();
    json!({ "policies": policies })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_document_holds_each_policy_as_a_put_sets_it() {
        let policy = Policy {
            name: "mailer.p0.mail.send".into(),
            pattern: "^p0\\.mail\\.send$".into(),
            definition: serde_json::from_value(json!({"delivery-limit": 5})).unwrap(),
        };
        assert_eq!(
            policy_definitions(&[&policy]),
            json!({"policies": [{"name": "mailer.p0.mail.send", "pattern": "^p0\\.mail\\.send$",
                                 "apply-to": "queues", "priority": 10,
                                 "definition": {"delivery-limit": 5}}]})
        );
    }
}
