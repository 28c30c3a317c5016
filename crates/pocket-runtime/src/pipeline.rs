//! The request pipeline: [`prepare`] (render, tokenize, check, plan under the budget) then
//! [`run`] (drafter, session, generation), for every entry point alike.
//!
//! The two steps are apart so that the daemon can plan without holding a thread for the
//! generation: when a plan does not fit it makes room (unloading idle models) or waits, and
//! prepares again. Everything else — which drafter, which cost model, where the encoder runs,
//! what is remembered afterwards — happens in [`run`], once, for `pocket run`, the daemon and
//! `pocket bench`.

use std::ops::ControlFlow;
use std::time::Instant;

use pocket_core::memory::{self, Ledger, ModelCosts, Plan, PlanRequest};
use pocket_core::spec::{DrafterReport, SpecMode};
use pocket_core::{
    ChatMessage, Constraint, Event, GenerateRequest, Generation, Guide, ModelKind, Role, SamplingConfig,
    SessionConfig, StopConfig, StopReason, Token, ToolCall, generate_guided,
};

use crate::drafters::{self, Setup};
use crate::grammar::{GRAMMAR_STATE_BYTES, Grammar, GrammarConstraint};
use crate::prompt_cache::{Adoption, PrefixKey};
use crate::reasoning::{self, ThinkingGate};
use crate::tools::{self, ToolChoice, Tools};
use crate::{DEFAULT_MAX_DRAFT, Error, LoadedModel, Result, Settings, validate};

/// What a request gives the model.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// Messages, rendered with the model's chat template, the assistant's turn opened.
    Chat(Vec<ChatMessage>),
    /// Text given to the model as it is (an encoder-decoder model's source).
    Text(String),
    /// Token ids, already encoded (a benchmark tokenizes its prompts once for every mode).
    Tokens(Vec<Token>),
}

/// One request: its input and everything that may be asked of its generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// What to generate from.
    pub input: Input,
    /// How tokens are chosen.
    pub sampling: SamplingConfig,
    /// When to stop (`max_tokens`, stop strings).
    pub stop: StopConfig,
    /// The speculation asked for.
    pub spec: SpecMode,
    /// The session asked for: KV type, context (capped at the model's training context),
    /// pass size, threads; `preallocate` for comparing with engines without a budget.
    pub session: SessionConfig,
    /// Longest draft asked for.
    pub max_draft: usize,
    /// Plan the session ([`pocket_core::memory::plan`]): a context of what the request can
    /// hold (prompt, `max_tokens`, one draft window) and rows of logits for the drafts it
    /// verifies, under what the ledger has free, giving things up in the designed order to fit
    /// (an unlimited ledger gives it all it asks). Every entry point plans; only a benchmark's
    /// `naive:` modes, which hold the whole context as engines without a budget do, do not.
    pub planned: bool,
    /// Continue from a parked session sharing a prefix with the prompt, and park this one when
    /// it ends, where the model has a [`crate::PromptCache`] (a benchmark turns it off to
    /// measure without).
    pub prompt_cache: bool,
    /// The client's hint for which parked sessions may be continued (OpenAI's
    /// `prompt_cache_key`, or `user`): only those parked under the same hint.
    pub cache_hint: Option<String>,
    /// What the output must be (a JSON schema, any JSON object, a Lark grammar): enforced
    /// token by token.
    pub grammar: Option<Grammar>,
    /// Report each generated token's log-probability with this many alternatives.
    pub logprobs: Option<usize>,
    /// The tools the model may call (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`).
    pub tools: Tools,
    /// More variables for the chat template (`chat_template_kwargs`: `enable_thinking`, …).
    pub template_kwargs: serde_json::Map<String, serde_json::Value>,
}

impl Request {
    /// A request for `input` with the defaults: greedy, 256 tokens, no speculation, the
    /// default session, planned.
    pub fn new(input: Input) -> Self {
        Request {
            input,
            sampling: SamplingConfig::default(),
            stop: StopConfig::default(),
            spec: SpecMode::Off,
            session: SessionConfig::default(),
            max_draft: DEFAULT_MAX_DRAFT,
            planned: true,
            prompt_cache: true,
            cache_hint: None,
            grammar: None,
            logprobs: None,
            tools: Tools::default(),
            template_kwargs: serde_json::Map::new(),
        }
    }
}

/// A request ready to run: its tokens and what it was given.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The prompt's tokens (an encoder-decoder model's source).
    pub tokens: Vec<Token>,
    /// The session it gets.
    pub config: SessionConfig,
    /// The speculation it runs with (the plan may have given it up).
    pub spec: SpecMode,
    /// Longest draft.
    pub max_draft: usize,
    /// Whether speculation uses the draft model.
    pub draft_model: bool,
    /// What the planner gave it, when it was planned.
    pub plan: Option<Plan>,
    /// How tokens are chosen.
    pub sampling: SamplingConfig,
    /// When to stop.
    pub stop: StopConfig,
    /// The parked session it continues, and how many of its tokens it takes.
    pub adopted: Option<Adoption>,
    /// Park the session when it ends (under this hint).
    pub park: Option<Park>,
    /// The client's hint: which earlier answers it drafts from, and where its answer goes.
    pub cache_hint: Option<String>,
    /// Draft from earlier answers and keep this one ([`crate::Histories`]): with the prompt
    /// cache, which a request (a benchmark's, `cache_prompt: false`) turns off with it.
    pub histories: bool,
    /// The request's grammar, compiled, in its start state.
    pub grammar: Option<GrammarConstraint>,
    /// Seconds compiling the grammar took (building the model's token trie, on its first
    /// constrained request, included).
    pub grammar_seconds: f64,
    /// Log-probabilities asked for.
    pub logprobs: Option<usize>,
    /// The functions the answer may call, by name (none: it is not read for tool calls).
    pub tool_names: Vec<String>,
    /// For a model that thinks ([`crate::reasoning`]), whether its output starts inside the
    /// thinking (`None`: it does not think, its thinking was turned off, or the input is not
    /// a chat).
    pub thinking: Option<bool>,
}

/// Where a finished session is parked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Park {
    /// The key it is parked under.
    pub key: PrefixKey,
    /// The client's hint.
    pub hint: Option<String>,
}

/// Where a running generation reports to.
pub trait Sink {
    /// The session exists (its memory is held) and generation starts.
    fn started(&mut self) {}

    /// One step of progress; [`ControlFlow::Break`] cancels the generation at this token.
    fn event(&mut self, event: Event<'_>) -> ControlFlow<()>;
}

/// A [`Sink`] from a closure over events.
pub struct OnEvent<F>(F);

impl<F: FnMut(Event<'_>) -> ControlFlow<()>> OnEvent<F> {
    /// A sink calling `f` with every event.
    pub fn new(f: F) -> Self {
        OnEvent(f)
    }
}

impl<F: FnMut(Event<'_>) -> ControlFlow<()>> Sink for OnEvent<F> {
    fn event(&mut self, event: Event<'_>) -> ControlFlow<()> {
        (self.0)(event)
    }
}

/// What a finished request produced and what it ran with.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// Tokens, text, why it stopped, timings and speculation statistics.
    pub generation: Generation,
    /// The speculation it ran with.
    pub spec: SpecMode,
    /// What the drafter did (`None` for plain decoding asked for); its `Display` is the line
    /// reports show.
    pub drafter: Option<DrafterReport>,
    /// Drafts taken from earlier answers ([`crate::Histories`]), and the tokens they held.
    pub recalled: (usize, usize),
    /// What the planner gave it, when it was planned.
    pub plan: Option<Plan>,
    /// Bytes of KV cache the session held at the end.
    pub kv_bytes: u64,
    /// Bytes the session held at the end (KV, compute and logits buffers).
    pub session_bytes: u64,
    /// Seconds compiling the request's grammar took.
    pub grammar_seconds: f64,
    /// The answer's text without its thinking and its tool calls (the generation's text when
    /// it made neither).
    pub content: String,
    /// The thinking of a model that thinks, apart from the answer.
    pub reasoning: Option<String>,
    /// Tokens of the thinking, `</think>` included (0 without any).
    pub reasoning_tokens: usize,
    /// The tools the answer calls, in OpenAI's shape.
    pub tool_calls: Vec<ToolCall>,
}

/// The tokens of `input` for `model`: chat messages through its chat template (the
/// assistant's turn opened), text as it is.
///
/// The template is the one the model file ships, rendered with minijinja as transformers
/// renders it (with `tools` when the model may call them); a model without one is rendered
/// by llama.cpp's detection of well-known templates. Where the template does not render
/// tools itself, they are described in the system message.
///
/// The model's BOS is added when its vocabulary asks for one, unless the rendered text
/// already starts with it: some templates write the BOS themselves (Gemma's), llama.cpp's
/// built-in ones mostly do not (Llama 3's), and a doubled BOS changes the output.
pub fn render(
    model: &LoadedModel,
    input: &Input,
    tools: &Tools,
    template_kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<Token>> {
    render_and_think(model, input, tools, template_kwargs).map(|(tokens, _)| tokens)
}

/// Refuses an embedding model, which makes vectors, not text (param `model`).
fn generates_text(model: &LoadedModel) -> Result<()> {
    if model.model().info().kind == pocket_core::ModelKind::Embedding {
        return Err(Error::invalid(
            "model",
            "this model is an embedding model: it makes vectors of texts (POST /v1/embeddings, D-Bus Embed, \
             pocket embed), not text",
        ));
    }
    Ok(())
}

/// [`render`], and whether the output starts inside a thinking block (`None` when the model
/// does not think or the input is not a chat).
fn render_and_think(
    model: &LoadedModel,
    input: &Input,
    tools: &Tools,
    template_kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<(Vec<Token>, Option<bool>)> {
    generates_text(model)?;
    let target = model.model();
    let info = target.info();
    let tokenizer = target.tokenizer();
    let mut thinking = None;
    let text = match input {
        Input::Tokens(tokens) => return Ok((tokens.clone(), None)),
        Input::Chat(_) if info.kind == ModelKind::EncoderDecoder => {
            return Err(Error::invalid(
                "messages",
                format!(
                    "{} is an encoder-decoder model with no chat template: it takes plain text, not chat \
                     messages; send the text as a completion prompt",
                    info.name
                ),
            ));
        }
        Input::Chat(messages) => {
            let text = render_chat(model, messages, tools, template_kwargs)?;
            if model.chat_template().as_ref().is_some_and(|t| t.thinks()) {
                thinking = reasoning::thinking_after(&text);
            }
            text
        }
        Input::Text(text) => text.clone(),
    };
    let encode =
        |special| tokenizer.encode(&text, special).map_err(|e| Error::invalid("prompt", e.to_string()));
    let (plain, with_special) = (encode(false)?, encode(true)?);
    let doubled_bos = with_special.len() == plain.len() + 1
        && with_special.get(1..) == Some(&plain[..])
        && plain.first() == with_special.first();
    Ok((if doubled_bos { plain } else { with_special }, thinking))
}

fn render_chat(
    model: &LoadedModel,
    messages: &[ChatMessage],
    tools: &Tools,
    template_kwargs: &serde_json::Map<String, serde_json::Value>,
) -> Result<String> {
    let template = model.chat_template();
    let offered = tools.offered();
    let mut described;
    let mut messages = messages;
    if offered && !template.as_ref().is_some_and(|t| t.renders_tools()) {
        // The tools go into the system message: the first one's, or one of their own.
        described = messages.to_vec();
        let prompt = tools.system_prompt();
        match described.first_mut() {
            Some(m) if m.role == Role::System => m.content = format!("{}\n\n{prompt}", m.content),
            _ => described.insert(0, ChatMessage::new(Role::System, prompt)),
        }
        messages = &described;
    }
    let invalid = |e: String| Error::invalid("messages", e);
    match template {
        Some(t) => {
            let defs: &[serde_json::Value] = if offered { &tools.tools } else { &[] };
            t.render(messages, defs, true, template_kwargs).map_err(|e| invalid(e.to_string()))
        }
        None => {
            model.model().tokenizer().apply_chat_template(messages, true).map_err(|e| invalid(e.to_string()))
        }
    }
}

/// Render, tokenize and check `request` for `model` (speculating with `draft` where given),
/// and plan its session under what `ledger` has free if it asks to be planned.
///
/// Errors, before anything is allocated: a mode the model does not offer, `draft` without a
/// draft model, bad sampling or stop settings, an empty prompt ([`Error::Invalid`]); a prompt
/// that leaves no room for one generated token ([`pocket_core::Error::ContextOverflow`]); a
/// plan that cannot fit ([`pocket_core::Error::OverBudget`], with the bytes).
pub fn prepare(
    model: &LoadedModel,
    draft: Option<&LoadedModel>,
    request: &Request,
    ledger: &Ledger,
) -> Result<Prepared> {
    generates_text(model)?;
    let target = model.model();
    let info = target.info();
    let spec = request.spec;
    let settings =
        Settings { spec, draft_model: draft.is_some(), sampling: &request.sampling, stop: &request.stop };
    validate(&settings, Some(model.engine()))?;
    if let Some(&(t, _)) = request.sampling.logit_bias.iter().find(|(t, _)| *t as usize >= info.n_vocab) {
        return Err(Error::invalid(
            "logit_bias",
            format!("logit_bias names token {t}; {} has tokens 0 to {}", info.name, info.n_vocab - 1),
        ));
    }

    request.tools.validate()?;
    let tool_grammar = request.tools.grammar();
    if tool_grammar.is_some() && request.grammar.is_some() {
        return Err(Error::invalid(
            "response_format",
            "response_format (or grammar) and tools cannot be combined: the answer is either a tool call or \
             the format asked for; send tool_choice \"none\" to use the format",
        ));
    }
    let (mut grammar, grammar_seconds) = match request.grammar.as_ref().or(tool_grammar.as_ref()) {
        None => (None, 0.0),
        Some(g) => {
            let start = Instant::now();
            let compiled = model.grammars()?.compile(g)?;
            (Some(compiled), start.elapsed().as_secs_f64())
        }
    };
    let (tokens, thinking) =
        render_and_think(model, &request.input, &request.tools, &request.template_kwargs)?;
    if tokens.is_empty() {
        return Err(Error::invalid("prompt", "the prompt is empty; it needs at least one token"));
    }
    // Token ids sent as they are index the embedding table: one past it is refused here.
    if let Some(&t) = tokens.iter().find(|&&t| t as usize >= info.n_vocab) {
        return Err(Error::invalid(
            "prompt",
            format!("the prompt holds token {t}; {} has tokens 0 to {}", info.name, info.n_vocab - 1),
        ));
    }
    let n_ctx = request.session.n_ctx.min(info.n_ctx_train.max(16));
    let seq2seq = info.kind == ModelKind::EncoderDecoder;
    // A decoder holds the prompt and at least one generated token; an encoder-decoder's
    // context holds the source, and its decoder the start token and the answer.
    let (needed, wanted) = if seq2seq {
        (tokens.len(), tokens.len().max(1 + request.stop.max_tokens))
    } else {
        (tokens.len() + 1, tokens.len() + request.stop.max_tokens)
    };
    if needed > n_ctx {
        return Err(pocket_core::Error::ContextOverflow { needed, limit: n_ctx, prompt: tokens.len() }.into());
    }
    // A JSON answer closes before the tokens run out (max_tokens, or the context's end).
    let context_room = if seq2seq { usize::MAX } else { n_ctx - tokens.len() };
    if let (Some(g), Some(Grammar::JsonObject | Grammar::JsonSchema { .. })) =
        (grammar.as_mut(), &request.grammar)
    {
        let room = request.stop.max_tokens.min(context_room);
        // Fewer tokens than the least answer could only give broken JSON: said before trying.
        if let Some((least, n)) = g.least_answer().filter(|&(_, n)| n > room) {
            let (param, what) = if room == request.stop.max_tokens {
                ("max_tokens", format!("max_tokens is {room}"))
            } else {
                ("prompt", format!("the context leaves {room} tokens after the prompt"))
            };
            return Err(Error::invalid(
                param,
                format!("{what}, but the shortest JSON the schema accepts takes {n} tokens: {least}"),
            ));
        }
        g.close_within(room);
    } else if let (Some(g), Some(body)) = (grammar.as_mut(), request.tools.call_schema()) {
        // A tool call's arguments close the same way; a cut call is then still a call.
        let text = request.tools.choice == ToolChoice::Auto;
        let markup = crate::tools::call_markup(text, request.tools.parallel);
        g.close_calls_within(request.stop.max_tokens.min(context_room), body, markup);
    }
    let mut config = SessionConfig { n_ctx, ..request.session.clone() };
    // The parked session sharing the longest prefix, in the KV type asked for.
    let cache = model.prompt_cache().filter(|_| request.prompt_cache && !config.preallocate);
    let mut adopted = cache.and_then(|c| {
        let key = model.prefix_key(config.threads.max(), config.kv)?;
        c.adopt(&key, &tokens, request.cache_hint.as_deref())
    });
    let (plan, spec, max_draft, draft_model) = if request.planned {
        let asked = PlanRequest {
            tokens: wanted.min(n_ctx),
            kv: config.kv,
            lowest_kv: model.knowledge().lowest_kv(),
            spec,
            max_draft: request.max_draft,
            n_batch: config.n_batch,
        };
        let mut costs = ModelCosts { target, draft: draft.map(|d| d.model()), config: config.clone() };
        // Parked sessions are the first thing given up: before anything the plan would give up.
        let keep = adopted.as_ref().map(|a| &a.parked);
        // Earlier answers kept for drafting go before them.
        let histories = model.histories().map(|(h, _)| h);
        let evict = || histories.is_some_and(|h| h.shrink()) || cache.is_some_and(|c| c.evict_lru(keep));
        let plan = loop {
            match memory::plan(ledger, &asked, &mut costs) {
                Ok(plan) if plan.degraded.is_empty() || !evict() => break plan,
                Ok(_) => {}
                Err(pocket_core::Error::OverBudget { .. }) if evict() => {}
                Err(e) => return Err(e.into()),
            }
        };
        plan.apply_to(&mut config);
        if adopted.as_ref().is_some_and(|a| a.parked.saved.kv != config.kv) {
            adopted = None; // the plan lowered the KV type: the parked state is in another
        }
        let (spec, max_draft, with_draft) = (plan.spec, plan.max_draft, plan.draft_model);
        (Some(plan), spec, max_draft, with_draft)
    } else {
        let with_draft = draft.is_some() && matches!(spec, SpecMode::Draft | SpecMode::Auto);
        (None, spec, request.max_draft, with_draft)
    };
    let park = cache.and_then(|_| {
        Some(Park {
            key: model.prefix_key(config.threads.max(), config.kv)?,
            hint: request.cache_hint.clone(),
        })
    });
    Ok(Prepared {
        adopted,
        park,
        cache_hint: request.cache_hint.clone(),
        histories: request.prompt_cache,
        tokens,
        config,
        spec,
        max_draft,
        draft_model,
        plan,
        sampling: request.sampling.clone(),
        stop: request.stop.clone(),
        grammar,
        grammar_seconds,
        logprobs: request.logprobs,
        tool_names: if request.tools.offered() {
            request.tools.names().into_iter().map(str::to_owned).collect()
        } else {
            Vec::new()
        },
        thinking,
    })
}

/// Generate what `prepared` asks for with `model` (and `draft`, if the plan kept it), its
/// session and drafter paying for their memory in `ledger`, reporting to `sink`.
///
/// The drafter is built from what is known about the model on this device; an encoder-decoder
/// model's source is encoded first (its time counts as prefill). A skip set that a `layerskip`
/// drafter found during the request is remembered. The session and drafter are dropped before
/// this returns, so their memory is back in the ledger.
pub fn run(
    model: &LoadedModel,
    draft: Option<&LoadedModel>,
    prepared: &Prepared,
    ledger: &Ledger,
    sink: &mut dyn Sink,
) -> Result<Outcome> {
    let p = prepared;
    let target = model.model();
    let info = target.info();
    let known = model.knowledge().known(p.config.threads.max(), p.config.kv);
    let seq2seq = info.kind == ModelKind::EncoderDecoder;
    let setup = Setup {
        model: target,
        draft_model: draft.filter(|_| p.draft_model).map(|d| d.model()),
        config: &p.config,
        known: &known,
        source: seq2seq.then_some(&p.tokens[..]),
        max_draft: p.max_draft,
        seed: p.sampling.seed,
        ledger,
        history: model
            .histories()
            .filter(|_| p.histories)
            .and_then(|(h, name)| h.get(&name, p.cache_hint.as_deref())),
    };
    let mut built = drafters::build(p.spec, &setup)?;
    let mut session = target.session_in(&p.config, ledger)?;
    sink.started();

    let start = Instant::now();
    let mut cached = 0;
    if let Some(a) = &p.adopted {
        match session.restore(&a.parked.saved, a.len) {
            Ok(()) => cached = a.len,
            Err(e) => tracing::warn!(model = %info.name, "cannot continue a parked session: {e}"),
        }
    }
    if let (Some(cache), Some(_)) = (model.prompt_cache(), &p.park) {
        cache.record(cached);
    }
    let prompt = if seq2seq {
        if cached == 0 {
            session.encode(&p.tokens)?;
        }
        let begin = target.decoder_start().ok_or_else(|| {
            pocket_core::Error::engine(format!(
                "{} is an encoder-decoder model without a decoder start",
                info.name
            ))
        })?;
        vec![begin]
    } else {
        p.tokens[cached..].to_vec()
    };
    let encode_seconds = start.elapsed().as_secs_f64();
    let request = GenerateRequest { prompt, sampling: p.sampling.clone(), stop: p.stop.clone() };
    // The grammar's state is paid for like the session's.
    let mut constraint = p.grammar.clone();
    let _grammar_memory = constraint
        .as_ref()
        .map(|_| ledger.reserve(GRAMMAR_STATE_BYTES, "the output grammar's state"))
        .transpose()?;
    // A model that thinks: the answer's grammar (a schema, a tool call) waits for the
    // thinking to end.
    let gate = match (&constraint, p.thinking) {
        (Some(_), Some(inside)) => {
            let tokenizer = target.tokenizer();
            let open = tokenizer.encode(reasoning::OPEN, false)?;
            Some(((open.len() == 1).then(|| open[0]), tokenizer.encode(reasoning::CLOSE, false)?, inside))
        }
        _ => None,
    };
    let mut generation = {
        let mut gated;
        let guided: Option<&mut dyn Constraint> = match (constraint.as_mut(), gate) {
            (Some(c), Some((open, close, inside))) => {
                gated = ThinkingGate::new(c, open, close, inside);
                Some(&mut gated)
            }
            (c, _) => c.map(|c| c as &mut dyn Constraint),
        };
        let guide = Guide {
            drafter: built.as_mut().map(|b| b.as_drafter()),
            constraint: guided,
            // Forced tokens ride in the draft window the plan gave speculation.
            max_forced: if p.spec == SpecMode::Off { 0 } else { p.max_draft },
            logprobs: p.logprobs,
        };
        generate_guided(info, session.as_mut(), target.tokenizer(), &request, guide, &mut |event| {
            sink.event(event)
        })?
    };
    // An answer closed early so that it would end as valid JSON was cut all the same.
    if constraint.as_ref().is_some_and(GrammarConstraint::closed) && generation.stop == StopReason::Eos {
        generation.stop = StopReason::MaxTokens;
    }
    // The prompt is all of it, restored and encoded parts included, and so is its time.
    generation.prompt_tokens = p.tokens.len();
    generation.cached_tokens = cached;
    generation.prefill_seconds += encode_seconds;
    if let Some(set) = built.as_ref().and_then(drafters::Built::found_skip_set)
        && model.knowledge().skip_set().as_ref() != Some(&set)
    {
        tracing::info!(model = %info.name, skip = ?set.skip, agreement = set.agreement, "found a layer-skip set");
        model.knowledge().remember_skip_set(set);
    }
    let (reasoning, answer) = match p.thinking {
        Some(inside) => reasoning::split(&generation.text, inside),
        None => (None, generation.text.clone()),
    };
    // The thinking's tokens: up to `</think>`'s last, or all of them when it never closed.
    let reasoning_tokens = match &reasoning {
        Some(_) => {
            let close = target.tokenizer().encode(reasoning::CLOSE, false)?;
            let tokens = &generation.tokens;
            (0..tokens.len())
                .find(|&i| tokens[i..].starts_with(&close))
                .map_or(tokens.len(), |i| i + close.len())
        }
        None => 0,
    };
    let (content, tool_calls) = if !p.tool_names.is_empty() {
        let seed = format!("{:?}/{}", std::time::SystemTime::now(), generation.tokens.len());
        tools::parse_calls(&answer, &p.tool_names, &seed)
    } else {
        (answer, Vec::new())
    };
    // The answer is kept for later requests to draft from; a cancelled one's is not.
    if let Some((histories, name)) = model.histories().filter(|_| p.histories)
        && generation.stop != StopReason::Cancelled
    {
        let prompt = if seq2seq { &request.prompt[..] } else { &p.tokens[..] };
        let learned = built.as_ref().and_then(drafters::Built::learned);
        histories.add(&name, p.cache_hint.as_deref(), prompt, &generation.tokens, learned);
    }
    let (kv_bytes, session_bytes) = (session.kv_bytes(), session.memory());
    if let (Some(park), Some(cache)) = (&p.park, model.prompt_cache())
        && let Err(e) = cache.park_session(park.key.clone(), park.hint.clone(), session.as_ref())
    {
        tracing::warn!(model = %info.name, "cannot park the session: {e}");
    }
    Ok(Outcome {
        spec: p.spec,
        recalled: built.as_ref().map_or((0, 0), drafters::Built::recalled),
        drafter: drafters::report(p.spec, built.as_mut()),
        plan: p.plan.clone(),
        kv_bytes,
        session_bytes,
        grammar_seconds: p.grammar_seconds,
        content,
        reasoning,
        reasoning_tokens,
        tool_calls,
        generation,
    })
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::sync::Arc;

    use pocket_core::testing::FakeModel;

    use super::*;
    use crate::{Engine, ErrorKind, OpenOptions};

    /// pocket-core's fake decoder, served as our graph would serve a file (greedy from `a`, it
    /// says `bcdefg` and ends).
    fn fake() -> LoadedModel {
        let options = OpenOptions { cache_dir: Some(std::env::temp_dir()), ..OpenOptions::default() };
        LoadedModel::from_model(
            Arc::new(FakeModel::default()),
            Engine::Ggml,
            Path::new("fake.gguf"),
            &options,
        )
    }

    fn text(prompt: &str) -> Request {
        Request { prompt_cache: false, ..Request::new(Input::Text(prompt.into())) }
    }

    /// Prepare and run `request`; the outcome and the text as it streamed.
    fn generate(model: &LoadedModel, request: &Request, ledger: &Ledger) -> Result<(Outcome, String)> {
        let prepared = prepare(model, None, request, ledger)?;
        let mut streamed = String::new();
        let mut sink = OnEvent::new(|e: pocket_core::Event<'_>| {
            streamed.push_str(e.text);
            ControlFlow::Continue(())
        });
        let outcome = run(model, None, &prepared, ledger, &mut sink)?;
        Ok((outcome, streamed))
    }

    #[test]
    fn a_request_runs_through_prepare_and_run_and_every_drafter_gives_the_plain_tokens() {
        let model = fake();
        let ledger = Ledger::unlimited();
        let (plain, streamed) = generate(&model, &text("a"), &ledger).unwrap();
        assert_eq!((plain.content.as_str(), streamed.as_str()), ("bcdefg", "bcdefg"));
        assert_eq!(plain.generation.stop, pocket_core::StopReason::Eos);
        for spec in [SpecMode::Suffix, SpecMode::Auto] {
            let (o, _) = generate(&model, &Request { spec, ..text("abcdefgabc") }, &ledger).unwrap();
            let (off, _) = generate(&model, &text("abcdefgabc"), &ledger).unwrap();
            assert_eq!(o.generation.tokens, off.generation.tokens, "{spec}");
        }
        // The session's memory is back when the request ends.
        assert_eq!(ledger.used(), 0);
    }

    #[test]
    fn answers_are_drafted_from_by_later_requests_under_the_same_hint_only() {
        let histories =
            Arc::new(crate::Histories::new(&Ledger::unlimited(), crate::histories::Limits::default()));
        let options = OpenOptions {
            cache_dir: Some(std::env::temp_dir()),
            histories: Some(histories.clone()),
            ..OpenOptions::default()
        };
        let model = LoadedModel::from_model(
            Arc::new(FakeModel::default()),
            Engine::Ggml,
            Path::new("fake.gguf"),
            &options,
        );
        let ledger = Ledger::unlimited();
        let ask = |hint: &str, spec| Request {
            spec,
            cache_hint: Some(hint.into()),
            prompt_cache: true,
            ..text("a")
        };
        let (plain, _) = generate(&model, &ask("app-a", SpecMode::Off), &ledger).unwrap();
        assert_eq!(plain.recalled, (0, 0));
        assert_eq!(histories.list().len(), 1);
        // The same app asking again drafts the earlier answer, and gets the same tokens.
        let (again, _) = generate(&model, &ask("app-a", SpecMode::Suffix), &ledger).unwrap();
        assert_eq!(again.generation.tokens, plain.generation.tokens);
        assert!(again.recalled.1 >= 3, "{:?}", again.recalled);
        assert!(again.generation.spec.accepted >= 3, "{:?}", again.generation.spec);
        // Another app has no earlier answers: nothing of app-a's is drafted into its answer.
        let (other, _) = generate(&model, &ask("app-b", SpecMode::Suffix), &ledger).unwrap();
        assert_eq!((other.generation.tokens, other.recalled), (plain.generation.tokens, (0, 0)));
        assert_eq!(histories.list().iter().map(|h| h.answers).sum::<usize>(), 3);
        // Cleared, app-a starts over.
        histories.clear(Some("app-a"));
        let (cleared, _) = generate(&model, &ask("app-a", SpecMode::Suffix), &ledger).unwrap();
        assert_eq!(cleared.recalled, (0, 0));
        // A request without the cache (a benchmark's) neither drafts from them nor adds to them.
        let before = histories.list();
        let uncached = Request { prompt_cache: false, ..ask("app-a", SpecMode::Suffix) };
        let (o, _) = generate(&model, &uncached, &ledger).unwrap();
        assert_eq!((o.recalled, histories.list()), ((0, 0), before));
    }

    #[test]
    fn bad_settings_are_refused_by_field_before_anything_runs() {
        let model = fake();
        let ledger = Ledger::unlimited();
        let refused = |request: Request| prepare(&model, None, &request, &ledger).unwrap_err();
        let hot = SamplingConfig { top_p: 2.0, ..SamplingConfig::default() };
        assert_eq!(refused(Request { sampling: hot, ..text("a") }).param(), Some("top_p"));
        let e = refused(Request { spec: SpecMode::InputCopy, ..text("a") });
        assert_eq!((e.kind(), e.param()), (ErrorKind::Invalid, Some("spec")));
        let stop = StopConfig { max_tokens: 4, stop: vec![String::new()] };
        assert_eq!(refused(Request { stop, ..text("a") }).param(), Some("stop"));
        let e = refused(text("xyz"));
        assert_eq!(e.kind(), ErrorKind::Invalid, "{e}");
        assert_eq!(ledger.used(), 0);
    }

    #[test]
    fn a_prompt_past_the_context_and_a_budget_too_small_are_refused_with_their_numbers() {
        let model = fake();
        let small = SessionConfig { n_ctx: 4, ..SessionConfig::default() };
        let long = Request { session: small, ..text("abcdefgabcdefg") };
        let e = prepare(&model, None, &long, &Ledger::unlimited()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::TooLarge, "{e}");
        let e = prepare(&model, None, &text("abc"), &Ledger::new(16)).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::OverBudget, "{e}");
    }
}
