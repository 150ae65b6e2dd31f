//! The HTTP API providers end to end (scenario `api`): the worker sending through each
//! API's stand-in ([`mailer_testkit::api`]), which checks every request as the service
//! does (SES's signature included) and answers at once. One provider per API for all its
//! runs, as in a long-running worker, so its pooled connections are reused: the stand-in
//! counts the connections it accepted.

use anyhow::{Result, ensure};
use mailer::provider;
use mailer_testkit::api::{ApiStandIn, Service};

use crate::broker::BenchVhost;
use crate::inproc::run_worker;
use crate::{Runs, Settings, cpu, load_average, met, report_run};

/// Mails per second each API must reach.
pub const TARGET: f64 = 1_000.0;

/// What one API's runs found.
pub struct ApiFigures {
    pub service: Service,
    pub worker: Runs,
    /// TCP connections the stand-in accepted over all the runs.
    pub connections: usize,
    pub mails: usize,
}

impl ApiFigures {
    pub fn verdict(&self) -> String {
        format!(
            "target >= {TARGET:.0} mails/s: {}",
            met(self.worker.best() >= TARGET)
        )
    }
}

/// Runs the worker through each API's stand-in: a warm-up, then up to 3 runs of
/// `MAILER_BENCH_API_N` mails.
pub async fn api_end_to_end(s: &Settings, body: &[u8]) -> Result<Vec<ApiFigures>> {
    let n = s.api_n;
    let mut figures = Vec::new();
    for service in Service::ALL {
        let stand_in = ApiStandIn::start_with(service, false).await;
        println!(
            "\n== 4. HTTP API end to end: {n} requests, worker with {}:// to a local stand-in answering at once (load {})",
            service.name(),
            load_average()
        );
        let vhost = BenchVhost::create(&format!("api-{}", service.name())).await?;
        let connection = vhost.connect().await?;
        let provider = provider::from_url(&stand_in.url())?;

        let warm = (n / 5).max(1);
        vhost.fill(&connection, warm, body).await?;
        run_worker(&vhost, provider.clone(), warm, "sent").await?;
        let mut expected = warm;
        println!("  warmed up with {warm} mails");

        let mut worker = Runs::default();
        for round in 0..s.rounds.min(3) {
            vhost.fill(&connection, n, body).await?;
            let clock = cpu::CpuClock::now();
            let took = run_worker(&vhost, provider.clone(), n, "sent").await?;
            let used = clock.used();
            worker.0.push(report_run(round, "worker", n, took, &used));
            expected += n;
        }
        let _ = connection.close(200, "done".into()).await;
        let problems = stand_in.problems();
        ensure!(
            problems.is_empty(),
            "the {} stand-in refused requests: {:?}",
            service.name(),
            &problems[..problems.len().min(3)]
        );
        ensure!(
            stand_in.taken() == expected,
            "the {} stand-in took {} mails, not the {expected} sent",
            service.name(),
            stand_in.taken()
        );
        let found = ApiFigures {
            service,
            worker,
            connections: stand_in.connections(),
            mails: expected,
        };
        println!(
            "  {}: {}; {} mails on {} connections; {}",
            service.name(),
            found.worker,
            found.mails,
            found.connections,
            found.verdict()
        );
        figures.push(found);
    }
    Ok(figures)
}
