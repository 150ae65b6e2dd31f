//! A TCP proxy in front of the test SMTP server that misbehaves on demand: it can pass
//! sessions through, accept them and never answer, or cut them in the middle of DATA.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Pass = 0,
    /// Accept the connection and never say anything.
    Silent = 1,
    /// Pass the session until the client sends the message after DATA, forward half of
    /// it, then drop both connections: the server never sees DATA's end.
    CutMidData = 2,
    /// Pass the session, each of the client's writes 50 ms late: a slow provider.
    Slow = 3,
}

pub struct SmtpProxy {
    pub port: u16,
    mode: Arc<AtomicU8>,
    /// Sessions accepted while silent.
    silent_sessions: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl SmtpProxy {
    pub async fn start(upstream: u16, mode: Mode) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let shared = Arc::new(AtomicU8::new(mode as u8));
        let current = shared.clone();
        let silent_sessions = Arc::new(AtomicUsize::new(0));
        let counted = silent_sessions.clone();
        let task = tokio::spawn(async move {
            let mut silent = Vec::new();
            while let Ok((client, _)) = listener.accept().await {
                match current.load(Ordering::SeqCst) {
                    1 => {
                        counted.fetch_add(1, Ordering::SeqCst);
                        silent.push(client);
                    }
                    mode => {
                        tokio::spawn(relay(client, upstream, mode));
                    }
                }
            }
        });
        Self {
            port,
            mode: shared,
            silent_sessions,
            task,
        }
    }

    /// Sessions opened from now on behave as `mode` says.
    pub fn set(&self, mode: Mode) {
        self.mode.store(mode as u8, Ordering::SeqCst);
    }

    /// How many sessions it accepted and left silent.
    pub fn silent_sessions(&self) -> usize {
        self.silent_sessions.load(Ordering::SeqCst)
    }
}

impl Drop for SmtpProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(client: TcpStream, upstream: u16, mode: u8) {
    let cut = mode == Mode::CutMidData as u8;
    let slow = mode == Mode::Slow as u8;
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let (mut client_read, mut client_write) = client.into_split();
    let (mut server_read, mut server_write) = server.into_split();
    let down = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut server_read, &mut client_write).await;
    });
    let mut buffer = vec![0u8; 64 * 1024];
    let mut after_data = false;
    while let Ok(n) = client_read.read(&mut buffer).await {
        if n == 0 {
            break;
        }
        let chunk = &buffer[..n];
        if slow {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        if cut && after_data {
            let _ = server_write.write_all(&chunk[..n / 2]).await;
            break;
        }
        if chunk
            .windows(6)
            .any(|w| w.eq_ignore_ascii_case(b"DATA\r\n"))
        {
            after_data = true;
        }
        if server_write.write_all(chunk).await.is_err() {
            break;
        }
    }
    down.abort();
}
