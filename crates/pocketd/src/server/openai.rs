//! The OpenAI adapter, wire to job: an OpenAI request's fields as a [`JobOptions`], each
//! field pocketd does not read refused by name.

use pocket_api::{LogprobsOption, ResponseFormat};
use pocket_core::spec::SpecMode;
use pocket_core::{KvType, SamplingConfig};
use pocket_runtime::grammar::Grammar;
use pocket_runtime::tools::{ToolChoice, Tools};

use super::error::ServeError;
use super::job::{Finished, JobOptions, check_priority, tool_choice};

/// The most alternatives `top_logprobs` (or a completion's `logprobs`) may ask for, as OpenAI.
const MAX_TOP_LOGPROBS: u32 = 20;

impl JobOptions {
    /// Settings from an OpenAI request's fields (with pocketd's `spec`, `draft_model`, `kv`,
    /// `grammar`). `chat` tells which endpoint: `logprobs` is a boolean there and a count for
    /// text completions. Fields pocketd does not read are refused, each by name.
    pub fn from_openai(o: &pocket_api::GenerationOptions, chat: bool) -> Result<JobOptions, ServeError> {
        if let Some((field, _)) =
            o.unsupported.iter().find(|(k, _)| !pocket_api::IGNORED_FIELDS.contains(&k.as_str()))
        {
            return Err(unsupported(field));
        }
        if o.stream_options.is_some() && !o.stream {
            return Err(ServeError::invalid(
                "stream_options",
                "stream_options is only allowed with stream: true",
            ));
        }
        choices(o)?;
        let mut sampling = SamplingConfig::default();
        if let Some(t) = o.temperature {
            sampling.temperature = t;
        }
        if let Some(p) = o.top_p {
            sampling.top_p = p;
        }
        if let Some(k) = o.top_k {
            sampling.top_k = k as usize;
        }
        if let Some(s) = o.seed {
            sampling.seed = s;
        }
        if let Some(p) = o.presence_penalty {
            sampling.presence_penalty = p;
        }
        if let Some(p) = o.frequency_penalty {
            sampling.frequency_penalty = p;
        }
        if let Some(p) = o.repetition_penalty {
            sampling.repetition_penalty = p;
        }
        if let Some(bias) = &o.logit_bias {
            sampling.logit_bias = bias
                .iter()
                .map(|(t, b)| {
                    t.parse::<u32>().map(|t| (t, *b)).map_err(|_| {
                        ServeError::invalid(
                            "logit_bias",
                            format!("logit_bias keys are token ids; {t:?} is not one"),
                        )
                    })
                })
                .collect::<Result<_, _>>()?;
        }
        let spec = o.spec.as_deref().map(|s| s.parse::<SpecMode>()).transpose()?;
        let kv = o.kv.as_deref().map(|s| s.parse::<KvType>()).transpose()?;
        let grammar = match (&o.response_format, &o.grammar) {
            (Some(f), Some(_)) if *f != ResponseFormat::Text => {
                return Err(ServeError::invalid(
                    "grammar",
                    "send either response_format or grammar, not both",
                ));
            }
            (_, Some(lark)) => Some(Grammar::Lark(lark.clone())),
            (Some(ResponseFormat::JsonObject), None) => Some(Grammar::JsonObject),
            (Some(ResponseFormat::JsonSchema { json_schema }), None) => Some(Grammar::JsonSchema {
                schema: json_schema.schema.clone(),
                strict: json_schema.strict.unwrap_or(false),
            }),
            (Some(ResponseFormat::Text) | None, None) => None,
        };
        let choice = match &o.tool_choice {
            None => ToolChoice::Auto,
            Some(c) => tool_choice(c)?,
        };
        let tools = Tools {
            tools: o.tools.clone().unwrap_or_default(),
            choice,
            parallel: o.parallel_tool_calls.unwrap_or(true),
        };
        let logprobs = match (o.logprobs, chat) {
            (None | Some(LogprobsOption::Enabled(false)), _) => None,
            (Some(LogprobsOption::Enabled(true)), _) => Some(o.top_logprobs.unwrap_or(0)),
            (Some(LogprobsOption::Count(n)), false) => Some(n),
            (Some(LogprobsOption::Count(_)), true) => {
                return Err(ServeError::invalid(
                    "logprobs",
                    "in chat completions logprobs is true or false; top_logprobs says how many alternatives",
                ));
            }
        };
        if let Some(n) = logprobs.filter(|&n| n > MAX_TOP_LOGPROBS) {
            let field = if chat { "top_logprobs" } else { "logprobs" };
            return Err(ServeError::invalid(
                field,
                format!("{field} = {n}: at most {MAX_TOP_LOGPROBS} alternatives"),
            ));
        }
        if o.top_logprobs.is_some() && logprobs.is_none() {
            return Err(ServeError::invalid("top_logprobs", "top_logprobs needs logprobs = true"));
        }
        let priority = o.priority.unwrap_or(0);
        check_priority(priority)?;
        let mut template_kwargs = o.chat_template_kwargs.clone().unwrap_or_default();
        if let Some(effort) = &o.reasoning_effort {
            thinking_effort("reasoning_effort", effort, &mut template_kwargs)?;
        }
        Ok(JobOptions {
            max_tokens: o.max_tokens,
            sampling,
            stop: o.stop.clone().map(pocket_api::Stop::into_vec).unwrap_or_default(),
            spec,
            draft_model: o.draft_model.clone(),
            kv,
            return_tokens: o.return_tokens,
            cache_key: o.prompt_cache_key.clone().or_else(|| o.user.clone()),
            cache_prompt: o.cache_prompt.unwrap_or(true),
            grammar,
            tools,
            logprobs: logprobs.map(|n| n as usize),
            priority,
            template_kwargs,
        })
    }
}

/// OpenAI's `reasoning_effort` (and the Responses API's `reasoning.effort`) for a model that
/// thinks: `none` turns the thinking off (`enable_thinking = false` for its template, unless
/// the request's `chat_template_kwargs` say otherwise); the other efforts leave it on — small
/// models have no budget to spend more or less of. `field` names it in the error.
pub fn thinking_effort(
    field: &str,
    effort: &str,
    kwargs: &mut serde_json::Map<String, serde_json::Value>,
) -> Result<(), ServeError> {
    match effort {
        "none" => {
            kwargs.entry("enable_thinking").or_insert(false.into());
            Ok(())
        }
        "minimal" | "low" | "medium" | "high" | "xhigh" => Ok(()),
        other => Err(ServeError::invalid(
            field,
            format!("{field} is none, minimal, low, medium, high or xhigh, not {other:?}"),
        )),
    }
}

/// The most choices one request may ask for (`n`): they are generated one after another.
pub const MAX_CHOICES: u32 = 16;

/// How many choices a request asks for (`n`, 1 by default), or the 400 that says what is
/// allowed.
pub fn choices(o: &pocket_api::GenerationOptions) -> Result<u32, ServeError> {
    match o.n.unwrap_or(1) {
        n @ 1..=MAX_CHOICES => Ok(n),
        n => Err(ServeError::invalid(
            "n",
            format!("n = {n}: from 1 to {MAX_CHOICES} choices (pocketd generates them one after another)"),
        )),
    }
}

impl super::job::Job {
    /// This job asked `n` times, a job per choice. Sampled choices differ: choice `i` seeds
    /// its sampler with the request's seed + `i` (greedy ones are the same answer `n` times,
    /// as OpenAI's at temperature 0).
    pub fn choices(self, n: u32) -> Vec<super::job::Job> {
        (0..u64::from(n))
            .map(|i| {
                let mut job = self.clone();
                job.options.sampling.seed = job.options.sampling.seed.wrapping_add(i);
                job
            })
            .collect()
    }
}

/// The 400 for a request field pocketd does not support, saying what to use instead where
/// something else does the job.
fn unsupported(field: &str) -> ServeError {
    let why = match field {
        "functions" | "function_call" => {
            "the deprecated functions API is not supported; send tools and tool_choice"
        }
        "echo" | "best_of" | "suffix" => "pocketd's completions do not support it",
        "audio" | "modalities" => "pocketd generates text only",
        "prediction" => {
            "predicted outputs are not supported; speculation (spec) drafts from the prompt already"
        }
        _ => "pocketd does not support this field",
    };
    ServeError::invalid(field, format!("{field}: {why}"))
}

/// `usage` with one more choice of the same prompt, which used `more`.
pub(super) fn with_choice(mut usage: pocket_api::Usage, more: pocket_api::Usage) -> pocket_api::Usage {
    usage.completion_tokens += more.completion_tokens;
    usage.total_tokens += more.completion_tokens;
    usage
}

/// The usage of several choices of one prompt: the prompt counted once (as OpenAI's), what
/// they generated summed.
pub(super) fn choices_usage(answers: &[Finished]) -> pocket_api::Usage {
    answers.iter().map(|f| f.usage).reduce(with_choice).unwrap_or_default()
}

/// The usage of two completions together.
pub(super) fn add_usage(a: pocket_api::Usage, b: pocket_api::Usage) -> pocket_api::Usage {
    let cached = |u: &pocket_api::Usage| u.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
    pocket_api::Usage {
        prompt_tokens: a.prompt_tokens + b.prompt_tokens,
        completion_tokens: a.completion_tokens + b.completion_tokens,
        total_tokens: a.total_tokens + b.total_tokens,
        prompt_tokens_details: (a.prompt_tokens_details.is_some() || b.prompt_tokens_details.is_some())
            .then(|| pocket_api::PromptTokensDetails { cached_tokens: cached(&a) + cached(&b) }),
        completion_tokens_details: match (a.completion_tokens_details, b.completion_tokens_details) {
            (None, None) => None,
            (x, y) => Some(pocket_api::CompletionTokensDetails {
                reasoning_tokens: x.map_or(0, |d| d.reasoning_tokens) + y.map_or(0, |d| d.reasoning_tokens),
            }),
        },
    }
}
