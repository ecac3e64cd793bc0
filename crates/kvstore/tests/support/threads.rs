//! Long-lived threads that run jobs one at a time, job `i` on thread `i % n`, for property
//! tests that drive an engine from several threads in a fixed order. Each thread keeps its
//! own range of CAS uniques (`log/cas.rs`), so a key written by one thread and then another
//! sees the ranges interleave as under a server's workers, while the operations keep the
//! test's order (and so can be compared with a model).
#![allow(dead_code)]

use std::sync::mpsc;
use std::thread::Scope;

type Job<'a> = Box<dyn FnOnce() + Send + 'a>;

pub(crate) struct Threads<'a> {
    tx: Vec<mpsc::Sender<Job<'a>>>,
}

impl<'a> Threads<'a> {
    /// `n` threads in scope `s`; they end when the `Threads` is dropped.
    pub(crate) fn start<'s>(s: &'s Scope<'s, 'a>, n: usize) -> Threads<'a> {
        let tx = (0..n.max(1))
            .map(|_| {
                let (tx, rx) = mpsc::channel::<Job<'a>>();
                s.spawn(move || rx.into_iter().for_each(|job| job()));
                tx
            })
            .collect();
        Threads { tx }
    }

    /// Run `f` on thread `i % n` and wait for its result.
    pub(crate) fn run<R: Send + 'a>(&self, i: usize, f: impl FnOnce() -> R + Send + 'a) -> R {
        let (done, wait) = mpsc::channel();
        let job: Job<'a> = Box::new(move || {
            let _ = done.send(f());
        });
        self.tx[i % self.tx.len()]
            .send(job)
            .unwrap_or_else(|_| panic!("worker thread gone"));
        wait.recv().unwrap_or_else(|_| panic!("job panicked"))
    }
}
