//! Running Rust code with Ruby's GVL released, interruptibly.
//!
//! `rb_thread_call_without_gvl2` is used rather than `rb_thread_call_without_gvl`: the latter
//! checks Ruby interrupts before and after the call and may raise straight through our Rust
//! frames (skipping destructors: a pooled connection or an acquired lock would leak). With the
//! `2` variant Ruby only reports "interrupted"; we clean up, then let Ruby raise (`ruby_errors.rs`).

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::error::LockError;

/// The interrupt flag of one GVL-free call. Ruby's unblocking function raises it; the code
/// running without the GVL polls it between steps, and waits on it instead of sleeping. A
/// waiter can also be woken early (a lock was released) through its `Waker`.
pub struct Interrupt {
    raised: AtomicBool,
    waker: Arc<Waker>,
    thread: libc::pthread_t,
}

/// Wakes a thread sleeping in `Interrupt::sleep_until`, from another thread.
#[derive(Default)]
pub struct Waker {
    woken: Mutex<bool>,
    wake: Condvar,
}

impl Waker {
    /// Ends the current (or next) sleep of the thread early; it then re-checks what it waits for.
    pub fn wake(&self) {
        if let Ok(mut woken) = self.woken.lock() {
            *woken = true;
        }
        self.wake.notify_all();
    }
}

impl Interrupt {
    /// An interrupt owned by the calling thread (the one the signal must reach).
    pub fn for_current_thread() -> Self {
        Interrupt {
            raised: AtomicBool::new(false),
            waker: Arc::new(Waker::default()),
            thread: unsafe { libc::pthread_self() },
        }
    }

    pub fn is_raised(&self) -> bool {
        self.raised.load(Ordering::Acquire)
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
        let poisoned = || LockError::Internal("waker mutex poisoned".into());
        let mut woken = self.waker.woken.lock().map_err(|_| poisoned())?;
        loop {
            self.check()?;
            let now = Instant::now();
            if std::mem::take(&mut *woken) || now >= until {
                return Ok(());
            }
            woken = match self.waker.wake.wait_timeout(woken, until - now) {
                Ok((guard, _)) => guard,
                Err(_) => return Err(poisoned()),
            };
        }
    }

    pub fn sleep(&self, duration: Duration) -> Result<(), LockError> {
        self.sleep_until(Instant::now() + duration)
    }

    /// Called by Ruby (never from a signal handler) on Thread#raise, Thread#kill, Ctrl-C...
    fn raise(&self) {
        self.raised.store(true, Ordering::Release);
        // Taking the mutex orders this notify after a sleeper's flag check: no lost wake-up.
        drop(self.waker.woken.lock());
        self.waker.wake.notify_all();
        // A thread blocked in recv() on a Redis socket only wakes for a signal. Ruby itself
        // uses SIGVTALRM, with a no-op handler installed without SA_RESTART, for this.
        if wake_signal_is_handled() {
            unsafe { libc::pthread_kill(self.thread, libc::SIGVTALRM) };
        }
    }
}

/// True when SIGVTALRM has a handler (Ruby installs one); sending it otherwise would kill us.
fn wake_signal_is_handled() -> bool {
    static HANDLED: OnceLock<bool> = OnceLock::new();
    *HANDLED.get_or_init(|| unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        libc::sigaction(libc::SIGVTALRM, std::ptr::null(), &mut current) == 0
            && current.sa_sigaction != libc::SIG_DFL
            && current.sa_sigaction != libc::SIG_IGN
    })
}

/// Reads the signal disposition while Ruby is known to have set it up (extension init).
pub fn init() {
    wake_signal_is_handled();
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
        interrupt: Interrupt::for_current_thread(),
    };
    let data = &mut call as *mut Call<F, R> as *mut c_void;
    let interrupt = &call.interrupt as *const Interrupt as *mut c_void;
    let unblock_function: Option<unsafe extern "C" fn(*mut c_void)> =
        if interruptible { Some(unblock) } else { None };
    unsafe {
        rb_sys::rb_thread_call_without_gvl2(
            Some(run_call::<F, R>),
            data,
            unblock_function,
            interrupt,
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
