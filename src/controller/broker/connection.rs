//! Finding the broker of a pipeline: from its `connectionSecret`, or from the
//! RabbitmqCluster its `clusterRef` names (the cluster's default-user Secret and its
//! Service's management port).

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DynamicObject};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Client, ResourceExt};
use serde_json::Value;

use crate::amqp::address::AmqpAddress;
use crate::controller::broker::secrets::{SecretRole, default_user_secret};
use crate::controller::broker::tenancy::{Use, check_allowed};
use crate::controller::error::Error;
use crate::controller::kube::secrets::{get_secret, required_key, secret_value};
use crate::spec::MailerPipeline;
use crate::topology::ManagementEndpoint;

/// The broker a pipeline uses and the operator's credentials for it.
#[derive(Debug, Clone)]
pub struct Broker {
    /// The metadata of the pipeline's connection Secret (`spec.rabbitmq.connectionSecret`,
    /// in its own namespace), which its cleanup needs: see [`crate::controller::broker::in_use`].
    pub connection_secret: Option<ObjectMeta>,
    /// The management API, with the operator's credentials.
    pub endpoint: ManagementEndpoint,
    /// The management API's URL without credentials, e.g. `http://rabbitmq.shop.svc:15672`.
    pub management_url: String,
    /// Where the workers (and the operator's live queue counts) connect over AMQP.
    pub amqp: AmqpAddress,
}

impl Broker {
    /// The AMQP URL of `vhost` with the operator's own credentials.
    pub fn operator_amqp_url(&self, vhost: &str) -> String {
        self.amqp
            .url(&self.endpoint.username, self.endpoint.password(), vhost)
    }
}

/// The optional key of a connection Secret with the broker's AMQP address, e.g.
/// `amqp://rabbitmq.shop.svc:5672`; without it, the management API's host on 5672 (5671
/// when the management API is https).
pub const AMQP_URI_KEY: &str = "amqpUri";

/// Finds the broker of `pipeline` through the Kubernetes API, to apply it.
pub async fn locate(client: &Client, pipeline: &MailerPipeline) -> Result<Broker, Error> {
    locate_for(client, pipeline, Use::Apply).await
}

/// Finds the broker of `pipeline` for `purpose`.
pub async fn locate_for(
    client: &Client,
    pipeline: &MailerPipeline,
    purpose: Use,
) -> Result<Broker, Error> {
    let namespace = pipeline
        .namespace()
        .ok_or(Error::IncompleteObject("namespace"))?;
    let rabbitmq = &pipeline.spec.rabbitmq;
    if let Some(reference) = &rabbitmq.connection_secret {
        // The messaging-topology-operator's convention.
        let wanted = SecretRole::Connection.wanted();
        let secret = get_secret(client, &namespace, &reference.name, wanted).await?;
        let value = |key: &str| required_key(&secret, &namespace, key, wanted);
        let url = value("uri")?;
        let mut broker = broker(&url, &value("username")?, &value("password")?)?;
        broker.connection_secret = Some(secret.metadata.clone());
        if let Some(uri) = secret_value(&secret, AMQP_URI_KEY).filter(|v| !v.trim().is_empty()) {
            broker.amqp =
                AmqpAddress::parse(&uri).map_err(|problem| Error::InvalidSecretValue {
                    namespace: namespace.clone(),
                    name: reference.name.clone(),
                    key: AMQP_URI_KEY.to_string(),
                    problem,
                })?;
        }
        return Ok(broker);
    }
    let Some(cluster_ref) = &rabbitmq.cluster_ref else {
        return Err(pipeline
            .spec
            .validate_for_operator()
            .err()
            .map_or(Error::IncompleteObject("spec.rabbitmq"), Error::from));
    };
    let cluster_namespace = cluster_ref.namespace_or(&namespace).to_string();
    let cluster_error = |problem: String| Error::Cluster {
        namespace: cluster_namespace.clone(),
        name: cluster_ref.name.clone(),
        problem,
    };
    let clusters: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        &cluster_namespace,
        &rabbitmq_cluster_resource(),
    );
    let found = clusters
        .get_opt(&cluster_ref.name)
        .await
        .map_err(|e| Error::kube("read the RabbitmqCluster", e))?;
    let elsewhere = cluster_namespace != namespace;
    let not_allowed = || Error::NotAllowed {
        cluster_namespace: cluster_namespace.clone(),
        cluster: cluster_ref.name.clone(),
        namespace: namespace.clone(),
    };
    let cluster = match found {
        Some(cluster) => cluster,
        // A tenant learns nothing of other namespaces: a cluster there that does not
        // exist gets the same answer as one that does not allow it.
        None if elsewhere => return Err(not_allowed()),
        None => {
            return Err(cluster_error(
                "does not exist; create it with RabbitMQ's cluster-operator, or fix spec.rabbitmq.clusterRef"
                    .into(),
            ));
        }
    };
    // Before anything of the cluster is read: its Secret is an administrator's.
    if purpose == Use::Apply {
        check_allowed(&cluster, &cluster_namespace, &namespace)?;
    }
    let names = ClusterNames::of(&cluster);
    let services: Api<Service> = Api::namespaced(client.clone(), &cluster_namespace);
    let service = services
        .get_opt(&names.service)
        .await
        .map_err(|e| Error::kube("read the RabbitmqCluster's Service", e))?
        .ok_or_else(|| {
            cluster_error(format!(
                "its Service {:?} does not exist yet; is the cluster still being created?",
                names.service
            ))
        })?;
    let wanted = SecretRole::ClusterDefaultUser.wanted();
    let secret = get_secret(client, &cluster_namespace, &names.secret, wanted).await?;
    let value = |key: &str| required_key(&secret, &cluster_namespace, key, wanted);
    let url = management_url(&names.service, &cluster_namespace, &service);
    let mut broker = broker(&url, &value("username")?, &value("password")?)?;
    broker.amqp = amqp_address(&broker.amqp, &service);
    Ok(broker)
}

/// The broker behind the management API `url`, its AMQP address beside it.
fn broker(url: &str, username: &str, password: &str) -> Result<Broker, Error> {
    let endpoint = ManagementEndpoint::with_credentials(url, username, password)?;
    Ok(Broker {
        connection_secret: None,
        amqp: endpoint.amqp_address(),
        endpoint,
        management_url: url.to_string(),
    })
}

/// A cluster's AMQP address: its Service's `amqps` port when the management API is
/// https and the Service has one, else its `amqp` port; `beside` when it names neither.
fn amqp_address(beside: &AmqpAddress, service: &Service) -> AmqpAddress {
    let port = |name: &str| {
        service
            .spec
            .as_ref()
            .and_then(|spec| spec.ports.as_deref())
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .and_then(|p| u16::try_from(p.port).ok())
    };
    let (tls, port) = match (beside.tls, port("amqps"), port("amqp")) {
        (true, Some(port), _) => (true, port),
        (_, _, Some(port)) => (false, port),
        (_, Some(port), None) => (true, port),
        _ => return beside.clone(),
    };
    AmqpAddress {
        tls,
        host: beside.host.clone(),
        port,
    }
}

/// The RabbitmqCluster resource of RabbitMQ's cluster-operator.
pub fn rabbitmq_cluster_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("rabbitmq.com", "v1beta1", "RabbitmqCluster"),
        "rabbitmqclusters",
    )
}

/// Where a RabbitmqCluster keeps its default user and its Service: as its status says,
/// or by the cluster-operator's naming convention while the status is not yet written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNames {
    pub secret: String,
    pub service: String,
}

impl ClusterNames {
    pub fn of(cluster: &DynamicObject) -> Self {
        let name = cluster.name_any();
        let default_user = cluster
            .data
            .get("status")
            .and_then(|status| status.get("defaultUser"));
        let reference = |field: &str| {
            default_user
                .and_then(|user| user.get(field))
                .and_then(|reference| reference.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        Self {
            secret: reference("secretReference").unwrap_or_else(|| default_user_secret(&name)),
            service: reference("serviceReference").unwrap_or(name),
        }
    }
}

/// The management API behind a cluster's Service: its `management` port over http, or
/// its `management-tls` port over https; 15672 when the Service names neither.
pub fn management_url(service_name: &str, namespace: &str, service: &Service) -> String {
    let ports = service
        .spec
        .as_ref()
        .and_then(|spec| spec.ports.as_deref())
        .unwrap_or_default();
    let port = |name: &str| {
        ports
            .iter()
            .find(|p| p.name.as_deref() == Some(name))
            .map(|p| p.port)
    };
    let (scheme, port) = match (port("management"), port("management-tls")) {
        (Some(port), _) => ("http", port),
        (None, Some(port)) => ("https", port),
        (None, None) => ("http", 15672),
    };
    format!("{scheme}://{service_name}.{namespace}.svc:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use serde_json::json;

    fn service(ports: &[(&str, i32)]) -> Service {
        Service {
            spec: Some(ServiceSpec {
                ports: Some(
                    ports
                        .iter()
                        .map(|(name, port)| ServicePort {
                            name: Some(name.to_string()),
                            port: *port,
                            ..ServicePort::default()
                        })
                        .collect(),
                ),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        }
    }

    #[test]
    fn the_amqp_port_is_found_by_name_and_follows_the_management_apis_tls() {
        let plain = AmqpAddress {
            tls: false,
            host: "rmq.shop.svc".into(),
            port: 5672,
        };
        let tls = AmqpAddress {
            tls: true,
            port: 5671,
            ..plain.clone()
        };
        let both = service(&[("amqp", 5673), ("amqps", 5674), ("management", 15672)]);
        assert_eq!(amqp_address(&plain, &both).port, 5673);
        let over_tls = amqp_address(&tls, &both);
        assert_eq!((over_tls.tls, over_tls.port), (true, 5674));
        let only_tls = amqp_address(&plain, &service(&[("amqps", 5674)]));
        assert_eq!((only_tls.tls, only_tls.port), (true, 5674));
        assert_eq!(amqp_address(&plain, &service(&[("http", 80)])), plain);
    }

    #[test]
    fn the_management_port_is_found_by_name() {
        let plain = service(&[("amqp", 5672), ("management", 15672)]);
        assert_eq!(
            management_url("rmq", "data", &plain),
            "http://rmq.data.svc:15672"
        );
        let tls = service(&[("amqps", 5671), ("management-tls", 15671)]);
        assert_eq!(
            management_url("rmq", "data", &tls),
            "https://rmq.data.svc:15671"
        );
        assert_eq!(
            management_url("rmq", "data", &Service::default()),
            "http://rmq.data.svc:15672"
        );
    }

    #[test]
    fn cluster_names_come_from_the_status_or_the_convention() {
        let resource = rabbitmq_cluster_resource();
        let mut cluster = DynamicObject::new("rmq", &resource);
        assert_eq!(
            ClusterNames::of(&cluster),
            ClusterNames {
                secret: "rmq-default-user".into(),
                service: "rmq".into()
            }
        );
        cluster.data = json!({"status": {"defaultUser": {
            "secretReference": {"name": "custom-user"},
            "serviceReference": {"name": "custom-svc"}
        }}});
        assert_eq!(
            ClusterNames::of(&cluster),
            ClusterNames {
                secret: "custom-user".into(),
                service: "custom-svc".into()
            }
        );
    }
}
