//! A TCP proxy in front of the API server that a test can cut and restore: one provisioner
//! talks through it, so that node alone loses the API (a network partition), as a firewall rule
//! or a broken link would do.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Result;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The proxy; dropping it stops accepting (connections in flight end with their peers).
pub struct CutProxy {
    addr: SocketAddr,
    cut: Arc<AtomicBool>,
    cut_signal: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> Result<CutProxy> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let cut = Arc::new(AtomicBool::new(false));
        let (cut_signal, cuts) = watch::channel(0u64);
        let task = tokio::spawn({
            let cut = cut.clone();
            async move {
                loop {
                    let Ok((client, _)) = listener.accept().await else { continue };
                    if cut.load(Ordering::SeqCst) {
                        drop(client); // refused, as an unreachable server would be
                        continue;
                    }
                    let mut cuts = cuts.clone();
                    cuts.mark_unchanged();
                    tokio::spawn(async move {
                        let Ok(server) = TcpStream::connect(target).await else { return };
                        let (mut client, mut server) = (client, server);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = cuts.changed() => {} // cut: both ends are dropped here
                        }
                    });
                }
            }
        });
        Ok(CutProxy { addr, cut, cut_signal, task })
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every connection and refuses new ones until [`CutProxy::restore`].
    pub fn cut(&self) {
        self.cut.store(true, Ordering::SeqCst);
        self.cut_signal.send_modify(|n| *n += 1);
    }

    /// Accepts and forwards connections again.
    pub fn restore(&self) {
        self.cut.store(false, Ordering::SeqCst);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}
