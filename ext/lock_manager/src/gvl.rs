//! Running Rust code with Ruby's GVL released, interruptibly.
//!
//! `rb_nogvl` with RB_NOGVL_INTR_FAIL (what `rb_thread_call_without_gvl2` does) is used rather
//! than `rb_thread_call_without_gvl`: the latter checks Ruby interrupts before and after the
//! call and may raise straight through our Rust frames (skipping destructors: a pooled
//! connection or an acquired lock would leak). Here Ruby only reports "interrupted"; we clean
//! up, then let Ruby raise (`ruby_errors.rs`).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::error::LockError;
use crate::waker::Waker;

/// The interrupt flag of one GVL-free call. Ruby's unblocking function raises it; the code
/// running without the GVL polls it between steps, and waits on it instead of sleeping. A
/// waiter can also be woken early (a lock was released) through its `Waker`.
pub struct Interrupt {
    raised: AtomicBool,
    waker: Arc<Waker>,
    thread: libc::pthread_t,
    /// Ruby's main thread runs the signal handlers (trap, Ctrl-C). When other Ruby threads
    /// exist, Ruby does not call our unblocking function for a signal: it sets a flag and sends
    /// SIGVTALRM until the main thread's blocking call returns with EINTR. So on the main
    /// thread, any EINTR is a reason to go back to Ruby and let it look.
    main_thread: bool,
}

/// `rb_nogvl` flags: never raise through our frames (INTR_FAIL); on Linux, also tell Ruby that
/// our unblocking function is async-signal-safe, which spares a main-thread call the helper
/// thread Ruby otherwise starts and stops around it (two per lock cycle, measured).
#[cfg(target_os = "linux")]
const NOGVL_FLAGS: i32 = (rb_sys::RB_NOGVL_INTR_FAIL | rb_sys::RB_NOGVL_UBF_ASYNC_SAFE) as i32;
#[cfg(not(target_os = "linux"))]
const NOGVL_FLAGS: i32 = rb_sys::RB_NOGVL_INTR_FAIL as i32;

impl Interrupt {
    /// An interrupt owned by the calling thread (the one the signal must reach).
    pub fn for_current_thread() -> Self {
        Interrupt {
            raised: AtomicBool::new(false),
            waker: Arc::new(Waker::default()),
            thread: unsafe { libc::pthread_self() },
            main_thread: false,
        }
    }

    /// The same, for a Ruby thread: called with the GVL held.
    fn for_ruby_thread() -> Self {
        let main_thread = unsafe { rb_sys::rb_thread_main() == rb_sys::rb_thread_current() };
        Interrupt {
            main_thread,
            ..Interrupt::for_current_thread()
        }
    }

    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
    }

    /// Whether a signal that cut a system call short must send us back to Ruby (on the main
    /// thread: see `main_thread`; or Ruby interrupted us), rather than be retried.
    pub fn takes_signals_to_ruby(&self) -> bool {
        self.main_thread || self.is_raised()
    }

    /// Fails fast with `Interrupted` once Ruby asked this thread to stop.
    pub fn check(&self) -> Result<(), LockError> {
        if self.is_raised() {
            Err(LockError::Interrupted)
        } else {
            Ok(())
        }
    }

    /// What other threads use to end this thread's sleep early.
    pub fn waker(&self) -> &Arc<Waker> {
        &self.waker
    }

    /// Sleeps until `until`, or until woken (`Ok`), or interrupted by Ruby (`Err(Interrupted)`).
    /// A wake-up that came before the sleep ends it at once: none is lost.
    pub fn sleep_until(&self, until: Instant) -> Result<(), LockError> {
        loop {
            self.check()?;
            if self.waker.take_woken() {
                return Ok(());
            }
            let now = Instant::now();
            if now >= until {
                return Ok(());
            }
            if self.waker.park(until - now) && self.main_thread {
                return Err(LockError::Interrupted);
            }
        }
    }

    /// Called by Ruby on Thread#raise, Thread#kill, Ctrl-C...; on Linux possibly from a signal
    /// handler, so only atomics and async-signal-safe system calls here.
    fn raise(&self) {
        // Once is enough: later raises (a second Thread#raise) would only cut short the
        // clean-up the thread is doing after the first (leaving the queue, undoing an acquire).
        if self.raised.swap(true, Ordering::AcqRel) {
            return;
        }
        self.waker.wake();
        // A thread blocked in recv() on a Redis socket only wakes for a signal. Ruby itself
        // uses SIGVTALRM, with a no-op handler installed without SA_RESTART, for this.
        if WAKE_SIGNAL_HANDLED.load(Ordering::Acquire) {
            unsafe { libc::pthread_kill(self.thread, libc::SIGVTALRM) };
        }
    }
}

/// Whether SIGVTALRM has a handler (Ruby installs one); sending it otherwise would kill us.
/// Read once at extension init, while Ruby's handlers are known to be in place.
static WAKE_SIGNAL_HANDLED: AtomicBool = AtomicBool::new(false);

pub fn init() {
    let handled = unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGVTALRM, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction != libc::SIG_DFL
            && current.sa_sigaction != libc::SIG_IGN
    };
    WAKE_SIGNAL_HANDLED.store(handled, Ordering::Release);
}

/// Blocks every signal in the calling thread: for the gem's background threads, so that the
/// process's signals (Ctrl-C, SIGCHLD, Ruby's own timer) go to Ruby's threads, which handle
/// them, and never cut our threads' Redis reads short.
pub fn block_signals_in_this_thread() {
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
    }
}

/// Runs `io`, a round trip on a TLS connection, with the asynchronous signals held back in the
/// calling thread. rustls retries a read that a signal cut short, each time with a fresh
/// `read_timeout`: Ruby's timer signal, sent every 100 ms while threads share the GVL, would keep
/// a read from a silent server going for ever, and the signal of an interrupt (`raise`) would be
/// swallowed. Held back, a signal waits until the read ends, by its reply or by `read_timeout`:
/// on a TLS connection an interrupt is seen within `read_timeout`. (Faults such as SIGSEGV are
/// never held.) `hold` false: `io` runs as it is (a TCP connection).
pub fn with_signals_held<T>(hold: bool, io: impl FnOnce() -> T) -> T {
    if !hold {
        return io();
    }
    struct Restore(libc::sigset_t);
    impl Drop for Restore {
        fn drop(&mut self) {
            unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
        }
    }
    let _restore = unsafe {
        let mut held: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut held);
        for fault in [
            libc::SIGSEGV,
            libc::SIGBUS,
            libc::SIGFPE,
            libc::SIGILL,
            libc::SIGABRT,
        ] {
            libc::sigdelset(&mut held, fault);
        }
        let mut previous: libc::sigset_t = std::mem::zeroed();
        libc::pthread_sigmask(libc::SIG_BLOCK, &held, &mut previous);
        Restore(previous)
    };
    io()
}

struct Call<F, R> {
    work: Option<F>,
    outcome: Option<Result<R, LockError>>,
    interrupt: Interrupt,
}

unsafe extern "C" fn run_call<F, R>(data: *mut c_void) -> *mut c_void
where
    F: FnOnce(&Interrupt) -> Result<R, LockError>,
{
    let call = &mut *(data as *mut Call<F, R>);
    if let Some(work) = call.work.take() {
        let interrupt = &call.interrupt;
        call.outcome = Some(guarded(|| work(interrupt)));
    }
    std::ptr::null_mut()
}

unsafe extern "C" fn unblock(data: *mut c_void) {
    (*(data as *const Interrupt)).raise();
}

/// Runs `work` without the GVL. Ruby may interrupt it: `work` then sees its `Interrupt` raised
/// and should return `Err(Interrupted)` promptly. Also `Err(Interrupted)` when an interrupt was
/// already pending, in which case `work` did not run at all.
pub fn without_gvl<F, R>(work: F) -> Result<R, LockError>
where
    F: FnOnce(&Interrupt) -> Result<R, LockError>,
{
    call_without_gvl(work, true).unwrap_or(Err(LockError::Interrupted))
}

/// Runs `work` to completion, for clean-up that must happen (releasing a lock) and is bounded
/// by the Redis read timeout. Ruby gets no unblocking function, so its interrupts stay pending
/// until we return. When one is already pending Ruby refuses to run GVL-free code: then `work`
/// runs with the GVL held, which is still bounded.
pub fn without_gvl_to_completion<F, R>(work: F) -> Result<R, LockError>
where
    F: FnOnce(&Interrupt) -> Result<R, LockError>,
{
    let mut work = Some(work);
    let outcome = call_without_gvl(
        |interrupt| (work.take().expect("runs once"))(interrupt),
        false,
    );
    match (outcome, work) {
        (Some(outcome), _) => outcome,
        (None, Some(work)) => guarded(|| work(&Interrupt::for_current_thread())),
        (None, None) => Err(LockError::Internal("GVL-free call lost its work".into())),
    }
}

/// `None` when Ruby did not run `work` because an interrupt was pending.
fn call_without_gvl<F, R>(work: F, interruptible: bool) -> Option<Result<R, LockError>>
where
    F: FnOnce(&Interrupt) -> Result<R, LockError>,
{
    let mut call = Call {
        work: Some(work),
        outcome: None,
        interrupt: Interrupt::for_ruby_thread(),
    };
    let data = &mut call as *mut Call<F, R> as *mut c_void;
    let interrupt = &call.interrupt as *const Interrupt as *mut c_void;
    let unblock_function: Option<unsafe extern "C" fn(*mut c_void)> =
        if interruptible { Some(unblock) } else { None };
    unsafe {
        rb_sys::rb_nogvl(
            Some(run_call::<F, R>),
            data,
            unblock_function,
            interrupt,
            NOGVL_FLAGS,
        );
    }
    call.outcome
}

/// Rust panics must never unwind into Ruby's C frames.
fn guarded<R>(work: impl FnOnce() -> Result<R, LockError>) -> Result<R, LockError> {
    catch_unwind(AssertUnwindSafe(work))
        .unwrap_or_else(|panic| Err(LockError::Internal(panic_message(panic))))
}

fn panic_message(panic: Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}
