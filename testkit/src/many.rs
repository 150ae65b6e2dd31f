//! Many pipelines in one vhost, each with names of its own, for the tests of a pass and
//! the topology benchmark (which includes this file).

use mailer::spec::MailerPipelineSpec;
use mailer::topology::{BrokerCapabilities, Topology};

/// The objects one pipeline's topology holds: 3 exchanges, 3 queues, 3 bindings, 3
/// policies.
pub const OBJECTS_PER_PIPELINE: usize = 12;

/// Pipeline `i` of a vhost, as the YAML of its spec on one line: its objects' names all
/// start with `p<i>.`.
pub fn pipeline_spec_yaml(vhost: &str, i: usize) -> String {
    format!(
        "{{rabbitmq: {{vhost: {vhost}}}, topology: {{exchange: p{i}.mail, retryExchange: p{i}.mail.retry, \
         deadExchange: p{i}.mail.dead, queue: p{i}.mail.send, retryQueue: p{i}.mail.send.retry, \
         deadQueue: p{i}.mail.send.dead}}}}"
    )
}

pub fn pipeline_spec(vhost: &str, i: usize) -> MailerPipelineSpec {
    serde_yaml::from_str(&pipeline_spec_yaml(vhost, i)).expect("a pipeline spec")
}

/// The topologies of pipelines `range` of `vhost`.
pub fn topologies(
    vhost: &str,
    range: std::ops::Range<usize>,
    capabilities: BrokerCapabilities,
) -> Vec<Topology> {
    range
        .map(|i| {
            let spec = pipeline_spec(vhost, i);
            Topology::desired(&spec.rabbitmq.vhost, &spec.topology, capabilities)
                .expect("a topology")
        })
        .collect()
}
