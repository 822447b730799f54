//! A fixed pool of verify threads with large stacks, for the server.

use std::sync::mpsc;
use std::sync::{Arc, Mutex};

use thiserror::Error;
use tokio::sync::oneshot;

use super::{Decision, ENGINE_STACK_BYTES, Policy, verify_guarded};

#[derive(Debug, Error)]
pub enum PoolError {
    #[error("cannot start verify thread: {0}")]
    Spawn(#[from] std::io::Error),
    #[error("the verify pool has stopped")]
    Stopped,
}

struct Job {
    policy: Arc<Policy>,
    sql: String,
    reply: oneshot::Sender<Decision>,
}

/// Verify threads fed through a queue. Dropping the pool stops the threads
/// once the queue is drained.
pub struct VerifyPool {
    queue: Mutex<Option<mpsc::Sender<Job>>>,
}

impl VerifyPool {
    /// Start `threads` workers (at least one).
    pub fn new(threads: usize) -> Result<Self, PoolError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            std::thread::Builder::new()
                .name(format!("haltsql-verify-{i}"))
                .stack_size(ENGINE_STACK_BYTES)
                .spawn(move || worker(&rx))?;
        }
        Ok(VerifyPool {
            queue: Mutex::new(Some(tx)),
        })
    }

    /// Verify `sql` on a pool thread.
    pub async fn verify(&self, policy: Arc<Policy>, sql: String) -> Result<Decision, PoolError> {
        let (reply, rx) = oneshot::channel();
        {
            let guard = self.queue.lock().map_err(|_| PoolError::Stopped)?;
            let tx = guard.as_ref().ok_or(PoolError::Stopped)?;
            tx.send(Job { policy, sql, reply })
                .map_err(|_| PoolError::Stopped)?;
        }
        rx.await.map_err(|_| PoolError::Stopped)
    }

    /// Stop accepting work; threads exit when the queue is empty.
    pub fn close(&self) {
        if let Ok(mut guard) = self.queue.lock() {
            guard.take();
        }
    }
}

fn worker(rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let job = {
            let Ok(guard) = rx.lock() else { return };
            match guard.recv() {
                Ok(job) => job,
                Err(_) => return,
            }
        };
        let decision = verify_guarded(&job.policy, &job.sql);
        // The requester may have gone away; nothing to do then.
        let _ = job.reply.send(decision);
    }
}
