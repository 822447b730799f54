//! A fixed pool of verify threads with large stacks, for the server.
//!
//! Small inputs (at most [`INLINE_MAX_SQL_BYTES`]) are verified on the
//! calling thread when it was started with the engine's stack (the server's
//! runtime threads, see [`super::mark_engine_stack`]): the hand-off to a
//! pool thread (a condition-variable wake and a oneshot wake per decision)
//! cost more than the verification of a typical query. Larger inputs still
//! go to the pool, so one can hold a runtime thread for a few milliseconds
//! at most.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use thiserror::Error;
use tokio::sync::oneshot;

use super::{Decision, ENGINE_STACK_BYTES, Policy, on_engine_stack, verify_guarded};

/// Largest SQL text verified on the caller's thread instead of the pool.
/// The slowest inputs of this size measured take about 3 ms (340 select
/// items; nested parentheses with a syntax error at the end, parsed twice,
/// about 1.5 ms), a typical query well under 0.1 ms. Inputs at the default
/// request limit (64 KiB) took up to about 40 ms, at the engine's caps
/// about 50 ms: those stay on the pool, so they never hold a runtime thread.
pub const INLINE_MAX_SQL_BYTES: usize = 1024;

/// Whether [`VerifyPool::verify`] verifies `sql` on the calling thread.
fn verifies_in_place(sql: &str) -> bool {
    sql.len() <= INLINE_MAX_SQL_BYTES && on_engine_stack()
}

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

#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    closed: bool,
}

/// The queue and the signal for idle workers. Workers wait on the condition
/// variable, which releases the lock: with a `Mutex<mpsc::Receiver>` the
/// worker blocked in `recv` held the lock, so every job also woke the other
/// worker just to hand it the lock and let it block again.
#[derive(Default)]
struct Shared {
    queue: Mutex<Queue>,
    ready: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        // A worker cannot panic while holding the lock (verification runs
        // outside it), so a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Verify threads fed through a queue. Dropping the pool stops the threads
/// once the queue is drained.
pub struct VerifyPool {
    shared: Arc<Shared>,
    /// Set by [`VerifyPool::close`]; read without the queue's lock by
    /// verifications that do not use the queue.
    closed: AtomicBool,
}

impl VerifyPool {
    /// Start `threads` workers (at least one).
    pub fn new(threads: usize) -> Result<Self, PoolError> {
        let shared = Arc::new(Shared::default());
        let pool = VerifyPool {
            shared: Arc::clone(&shared),
            closed: AtomicBool::new(false),
        };
        for i in 0..threads.max(1) {
            let shared = Arc::clone(&shared);
            // On an error, dropping `pool` stops the workers already started.
            std::thread::Builder::new()
                .name(format!("haltsql-verify-{i}"))
                .stack_size(ENGINE_STACK_BYTES)
                .spawn(move || worker(&shared))?;
        }
        Ok(pool)
    }

    /// Verify `sql`: on this thread when it is small and this thread has
    /// the engine's stack, else on a pool thread.
    pub async fn verify(&self, policy: &Arc<Policy>, sql: &str) -> Result<Decision, PoolError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(PoolError::Stopped);
        }
        if verifies_in_place(sql) {
            return Ok(verify_guarded(policy, sql));
        }
        let (reply, rx) = oneshot::channel();
        {
            let mut q = self.shared.lock();
            if q.closed {
                return Err(PoolError::Stopped);
            }
            q.jobs.push_back(Job {
                policy: Arc::clone(policy),
                sql: sql.to_owned(),
                reply,
            });
        }
        self.shared.ready.notify_one();
        rx.await.map_err(|_| PoolError::Stopped)
    }

    /// Stop accepting work; threads exit when the queue is empty.
    pub fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.shared.lock().closed = true;
        self.shared.ready.notify_all();
    }
}

impl Drop for VerifyPool {
    fn drop(&mut self) {
        self.close();
    }
}

fn worker(shared: &Shared) {
    loop {
        let job = {
            let mut q = shared.lock();
            loop {
                if let Some(job) = q.jobs.pop_front() {
                    break job;
                }
                if q.closed {
                    return;
                }
                q = shared.ready.wait(q).unwrap_or_else(PoisonError::into_inner);
            }
        };
        let decision = verify_guarded(&job.policy, &job.sql);
        // The requester may have gone away; nothing to do then.
        let _ = job.reply.send(decision);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::engine::{Rules, StatementKind, verify};

    fn orders_policy() -> Arc<Policy> {
        Arc::new(Policy::new(&Rules {
            name: "orders".into(),
            allowed_statements: vec![StatementKind::Select],
            tables: BTreeMap::from([("orders".to_owned(), Some(vec!["id".to_owned()]))]),
            ..Rules::default()
        }))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn every_job_gets_the_engine_s_answer_and_a_closed_pool_takes_none() {
        let pool = Arc::new(VerifyPool::new(2).unwrap());
        let policy = orders_policy();
        let queries: Vec<String> = (0..64)
            .map(|i| match i % 2 {
                0 => format!("SELECT id FROM orders LIMIT {i}"),
                _ => format!("SELECT email FROM orders LIMIT {i}"),
            })
            .collect();
        // All queued at once, more than the workers, so jobs wait in the queue.
        let tasks: Vec<_> = queries
            .iter()
            .map(|sql| {
                let (pool, policy, sql) = (Arc::clone(&pool), Arc::clone(&policy), sql.clone());
                tokio::spawn(async move { pool.verify(&policy, &sql).await })
            })
            .collect();
        for (sql, task) in queries.iter().zip(tasks) {
            // A job left in the queue (a missed wake-up) fails here, not hangs.
            let answer = tokio::time::timeout(std::time::Duration::from_secs(30), task).await;
            let decision = answer.expect("answered in time").unwrap().unwrap();
            assert_eq!(decision, verify(&policy, sql), "{sql}");
        }
        assert!(verify(&policy, &queries[0]).allowed);
        assert!(!verify(&policy, &queries[1]).allowed);

        pool.close();
        assert!(matches!(
            pool.verify(&policy, &queries[0]).await,
            Err(PoolError::Stopped)
        ));
    }

    /// Polls `verify` once and finishes it on `rt`; says whether the first
    /// poll answered. A verification in place always answers on the first
    /// poll (it never waits). A pool job usually does not, but may when the
    /// worker finishes before the poll looks, so only the first is asserted.
    fn poll_once_then_finish(
        rt: &tokio::runtime::Runtime,
        pool: &VerifyPool,
        policy: &Arc<Policy>,
        sql: &str,
    ) -> (bool, Result<Decision, PoolError>) {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let mut verify = std::pin::pin!(pool.verify(policy, sql));
        match verify
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
        {
            Poll::Ready(answer) => (true, answer),
            Poll::Pending => (false, rt.block_on(verify)),
        }
    }

    /// On a thread marked as having the engine's stack, small inputs are
    /// verified in place (and answered on the first poll) and large ones
    /// still go through the queue; unmarked threads always use the queue;
    /// every path gets the engine's own answer, and a closed pool refuses
    /// both.
    #[test]
    fn marked_threads_verify_small_inputs_in_place() {
        let pool = VerifyPool::new(1).unwrap();
        let policy = orders_policy();
        let small = "SELECT id FROM orders LIMIT 1".to_owned();
        let large = format!(
            "SELECT id FROM orders WHERE id IN ({}) LIMIT 1",
            vec!["1"; INLINE_MAX_SQL_BYTES].join(",")
        );
        let denied = large.replacen("SELECT id", "SELECT email", 1);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // This thread is not marked: even a small input goes to the pool.
        assert!(!verifies_in_place(&small));
        let (_, answer) = poll_once_then_finish(&rt, &pool, &policy, &small);
        assert!(answer.unwrap().allowed);
        let results = std::thread::Builder::new()
            .stack_size(ENGINE_STACK_BYTES)
            .spawn(move || {
                crate::engine::mark_engine_stack();
                let answers: Vec<_> = [&small, &large, &denied]
                    .into_iter()
                    .map(|sql| {
                        let routed_in_place = verifies_in_place(sql);
                        let (first_poll, answer) = poll_once_then_finish(&rt, &pool, &policy, sql);
                        (sql.clone(), routed_in_place, first_poll, answer)
                    })
                    .collect();
                pool.close();
                let refused = rt.block_on(pool.verify(&policy, &small));
                (answers, matches!(refused, Err(PoolError::Stopped)), policy)
            })
            .unwrap()
            .join()
            .unwrap();
        let (answers, refused, policy) = results;
        for (sql, _, _, answer) in &answers {
            assert_eq!(answer.as_ref().unwrap(), &verify(&policy, sql), "{sql}");
        }
        let routed: Vec<bool> = answers.iter().map(|a| a.1).collect();
        assert_eq!(
            routed,
            [true, false, false],
            "small in place, large on the pool"
        );
        assert!(
            answers[0].2,
            "the small input was not answered on the first poll"
        );
        assert!(answers[0].3.as_ref().unwrap().allowed);
        assert!(answers[1].3.as_ref().unwrap().allowed);
        assert!(!answers[2].3.as_ref().unwrap().allowed);
        assert!(refused);
    }
}
