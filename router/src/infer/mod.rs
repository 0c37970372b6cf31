//! The request lifecycle: admit (concurrency limit) → validate → submit to the scheduler
//! → follow the sequence's events into TGI responses. No scheduling decisions here.
mod best_of;
mod sequence;
mod streaming;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::Stream;
use opentelemetry::trace::SpanContext;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::errors::InferError;
use crate::metrics::{Outcome, RequestMeter};
use crate::scheduler::{GenerationFailure, SchedulerHandle, SequenceRequest, SequenceStream};
use crate::schema::{Details, GenerateRequest, GenerateResponse, StreamResponse};
pub use crate::telemetry::request_span::RequestShape;
use crate::tokenizer::TextTokenizer;
use crate::validation::{GenerationInput, ValidRequest, Validation};

pub use sequence::{Progress, SequenceDecoder, SequenceRecord, SequenceSpec, TokenUpdate};
use streaming::{Step, StreamBuilder};

/// Shared by every request handler.
#[derive(Debug)]
pub struct Infer {
    scheduler: SchedulerHandle,
    validation: Validation,
    tokenizer: Arc<TextTokenizer>,
    limiter: Arc<Semaphore>,
    stop_token_ids: Vec<u32>,
}

/// Phase durations of a finished request (TGI's x-* headers).
#[derive(Debug, Clone, Copy, Default)]
pub struct Timings {
    pub validation: Duration,
    pub queue: Duration,
    pub inference: Duration,
    pub total: Duration,
}

#[derive(Debug, Clone)]
pub struct GenerateOutput {
    pub response: GenerateResponse,
    pub input_length: u32,
    pub generated_tokens: u32,
    pub timings: Timings,
}

/// What a streaming request knows before its first token.
#[derive(Debug, Clone, Copy)]
pub struct StreamStart {
    pub input_length: u32,
}

pub type StreamItem = Result<StreamResponse, InferError>;

/// What the request span reports about a validated request.
pub fn request_shape(valid: &ValidRequest) -> RequestShape<'_> {
    RequestShape {
        input_tokens: valid.input_ids.len() as u32,
        max_new_tokens: valid.max_new_tokens,
        sampling: &valid.params.sampling,
        seed: valid.params.seed,
    }
}

/// The metric outcome of a failed request.
pub fn outcome_of(err: &InferError) -> Outcome {
    match err {
        InferError::Validation(_) | InferError::Refused(_) => Outcome::Validation,
        InferError::Overloaded => Outcome::Overloaded,
        InferError::Generation(_) | InferError::SchedulerStopped => Outcome::Generation,
        InferError::IncompleteGeneration => Outcome::Incomplete,
    }
}

impl Infer {
    pub fn new(
        scheduler: SchedulerHandle,
        validation: Validation,
        tokenizer: Arc<TextTokenizer>,
        max_concurrent_requests: usize,
        stop_token_ids: Vec<u32>,
    ) -> Self {
        Self {
            scheduler,
            validation,
            tokenizer,
            limiter: Arc::new(Semaphore::new(max_concurrent_requests)),
            stop_token_ids,
        }
    }

    pub fn tokenizer(&self) -> &Arc<TextTokenizer> {
        &self.tokenizer
    }

    /// Takes a concurrency slot (429 when none is free), then validates. The slot is held
    /// by the returned value for the request's whole life.
    pub async fn admit_valid(
        &self,
        input: GenerationInput,
        streaming: bool,
    ) -> Result<Admitted, InferError> {
        let permit = self.admit()?;
        let valid = self.validation.validate(input, streaming).await?;
        Ok(Admitted {
            _permit: permit,
            valid,
        })
    }

    /// Runs one sequence per seed to its end; only the first feeds the token timings
    /// (of `meter`, when given). `trace` is the request's span, when traced.
    pub async fn run_all(
        &self,
        valid: &ValidRequest,
        seeds: &[u64],
        meter: Option<&mut RequestMeter>,
        trace: Option<SpanContext>,
    ) -> Result<Vec<FinishedSequence>, InferError> {
        let mut timing_meter = meter;
        let mut runs = Vec::with_capacity(seeds.len());
        for &seed in seeds {
            let events = self.submit(valid, seed, trace.clone())?;
            let meter = timing_meter.take();
            runs.push(run_to_end(
                self.tokenizer.clone(),
                self.spec(valid),
                events,
                meter,
            ));
        }
        futures::future::try_join_all(runs).await
    }

    /// Submits one sequence for streaming: its decoder and its events. Dropping the
    /// events cancels it. `trace` is the request's span, when traced.
    pub fn start(
        &self,
        valid: &ValidRequest,
        seed: u64,
        trace: Option<SpanContext>,
    ) -> Result<(SequenceDecoder, SequenceStream), InferError> {
        let events = self.submit(valid, seed, trace)?;
        let decoder = SequenceDecoder::new(self.tokenizer.clone(), self.spec(valid));
        Ok((decoder, events))
    }

    /// Takes a concurrency slot for the request's whole life, or answers 429.
    fn admit(&self) -> Result<OwnedSemaphorePermit, InferError> {
        self.limiter
            .clone()
            .try_acquire_owned()
            .map_err(|_| InferError::Overloaded)
    }

    /// The model's EOS ids, then the request's own stop tokens: each ends the sequence.
    fn stop_token_ids(&self, valid: &ValidRequest) -> Vec<u32> {
        let mut ids = self.stop_token_ids.clone();
        ids.extend(
            valid
                .params
                .stop_token_ids
                .iter()
                .filter(|id| !self.stop_token_ids.contains(id)),
        );
        ids
    }

    fn spec(&self, valid: &ValidRequest) -> SequenceSpec {
        SequenceSpec {
            input_ids: valid.input_ids.clone(),
            max_new_tokens: valid.max_new_tokens,
            stop_token_ids: self.stop_token_ids(valid),
            stop_sequences: valid.params.stop.clone(),
            skip_special_tokens: valid.params.skip_special_tokens,
            include_stop_str_in_output: valid.params.include_stop_str_in_output,
        }
    }

    fn submit(
        &self,
        valid: &ValidRequest,
        seed: u64,
        trace: Option<SpanContext>,
    ) -> Result<SequenceStream, InferError> {
        let mut sampling = valid.params.sampling.clone();
        sampling.seed = seed;
        let request = SequenceRequest {
            input_ids: valid.input_ids.clone(),
            sampling,
            max_new_tokens: valid.max_new_tokens,
            stop_token_ids: self.stop_token_ids(valid),
            prefill_logprobs: valid.params.decoder_input_details,
            top_n_tokens: valid.params.top_n_tokens,
            grammar: valid.params.grammar.clone(),
            trace,
        };
        self.scheduler
            .submit(request)
            .map_err(|_| InferError::SchedulerStopped)
    }

    /// `/generate`: runs `best_of` sequences and answers with the best one.
    pub async fn generate(
        &self,
        request: GenerateRequest,
        meter: &mut RequestMeter,
    ) -> Result<GenerateOutput, InferError> {
        let _permit = self.admit()?;
        let valid = self.validation.validate(request, false).await?;
        meter.trace().on_validated(request_shape(&valid));
        let validated_at = Instant::now();
        let seeds = best_of::seeds(&valid);
        // Only the first sequence feeds token timings, so best_of does not skew them.
        let trace = meter.trace().span_context();
        let finished = self
            .run_all(&valid, &seeds, Some(&mut *meter), trace)
            .await?;
        let inference_end = Instant::now();
        let (best, others) = best_of::pick(finished, &seeds);
        meter.trace().add_finish_reason(best.finish.as_str());
        let input_length = valid.input_ids.len() as u32;
        let generated_tokens = best.decoder.record().tokens.len() as u32;
        let queue = best.decoder.record().queue_time;
        let mut generated_text = best.decoder.generated_text();
        if valid.params.return_full_text {
            generated_text.insert_str(0, &valid.inputs);
        }
        let details = valid.params.details.then(|| Details {
            finish_reason: best.finish,
            generated_tokens,
            // TGI reports a seed only when it was used (sampling).
            seed: valid.params.sampling.do_sample.then_some(best.seed),
            prefill: best.decoder.record().prefill.clone(),
            tokens: best.decoder.record().tokens.clone(),
            top_tokens: best.decoder.record().top_tokens.clone(),
            best_of_sequences: (valid.params.best_of > 1).then(|| {
                others
                    .into_iter()
                    .map(best_of::to_best_of_sequence)
                    .collect()
            }),
        });
        let validation = validated_at - meter.arrived();
        Ok(GenerateOutput {
            response: GenerateResponse {
                generated_text,
                details,
            },
            input_length,
            generated_tokens,
            timings: Timings {
                validation,
                queue,
                inference: (inference_end - validated_at).saturating_sub(queue),
                total: meter.arrived().elapsed(),
            },
        })
    }

    /// `/generate_stream`: validates and submits now (errors here keep their HTTP
    /// status), then yields one item per token; the last carries text and details.
    /// Dropping the stream cancels the sequence.
    pub async fn generate_stream(
        &self,
        request: GenerateRequest,
        mut meter: RequestMeter,
    ) -> Result<(StreamStart, impl Stream<Item = StreamItem> + Send + 'static), InferError> {
        let admitted = async {
            let permit = self.admit()?;
            let valid = self.validation.validate(request, true).await?;
            meter.trace().on_validated(request_shape(&valid));
            let trace = meter.trace().span_context();
            let events = self.submit(&valid, valid.params.sampling.seed, trace)?;
            Ok::<_, InferError>((permit, valid, events))
        };
        let (permit, valid, mut events) = match admitted.await {
            Ok(admitted) => admitted,
            Err(err) => {
                meter.finish(outcome_of(&err));
                return Err(err);
            }
        };
        let input_length = valid.input_ids.len() as u32;
        let sampling = &valid.params.sampling;
        let mut builder = StreamBuilder::new(
            SequenceDecoder::new(self.tokenizer.clone(), self.spec(&valid)),
            meter,
            input_length,
            sampling.do_sample.then_some(sampling.seed),
            valid.params.return_full_text.then(|| valid.inputs.clone()),
        );
        let stream = async_stream::stream! {
            let _permit = permit;
            loop {
                let Some(event) = events.recv().await else {
                    yield builder.on_closed();
                    break;
                };
                match builder.on_event(event) {
                    Step::Wait => {}
                    Step::Send(response) => yield Ok(response),
                    Step::Last(item) => {
                        yield item;
                        break;
                    }
                }
            }
        };
        Ok((StreamStart { input_length }, stream))
    }

    /// `/tokenize`.
    pub async fn tokenize(
        &self,
        text: String,
    ) -> Result<Vec<crate::schema::SimpleToken>, InferError> {
        self.tokenize_text(text, Vec::new(), true).await
    }

    /// `/chat_tokenize`: a templated prompt, which already holds its special tokens; the
    /// messages' text in it is tokenized as text (`TextTokenizer::encode_chat`).
    pub async fn tokenize_chat(
        &self,
        chat: crate::chat_template::RenderedChat,
    ) -> Result<Vec<crate::schema::SimpleToken>, InferError> {
        self.tokenize_text(chat.text, chat.content, false).await
    }

    async fn tokenize_text(
        &self,
        text: String,
        content: Vec<std::ops::Range<usize>>,
        add_special_tokens: bool,
    ) -> Result<Vec<crate::schema::SimpleToken>, InferError> {
        use crate::validation::ValidationError;
        // A concurrency slot like a generation (429 when none is free): a long input's
        // tokenization holds memory (~150 MB for 800 KB) while it runs.
        let _permit = self.admit()?;
        let tokenizer = self.tokenizer.clone();
        let max_input_tokens = self.validation.limits().max_input_tokens;
        // Bounded like `/generate`'s prompt: the ids are counted first (linear, in parallel
        // chunks), and only a prompt within `--max-input-tokens` gets its offsets and texts.
        let tokenized = tokio::task::spawn_blocking(move || {
            let count = tokenizer
                .encode_chat(&text, &content, add_special_tokens)?
                .len();
            let count = u32::try_from(count).unwrap_or(u32::MAX);
            if count > max_input_tokens {
                return Ok(Err(ValidationError::InputLength(max_input_tokens, count)));
            }
            tokenizer
                .tokenize_chat(&text, &content, add_special_tokens)
                .map(Ok)
        })
        .await
        .map_err(|err| InferError::Generation(GenerationFailure::router(err.to_string())))?
        .map_err(|err| ValidationError::Tokenizer(err.0))?;
        Ok(tokenized?)
    }
}

/// A request holding its concurrency slot, validated.
pub struct Admitted {
    _permit: OwnedSemaphorePermit,
    pub valid: ValidRequest,
}

/// A sequence followed to its end.
pub struct FinishedSequence {
    pub decoder: SequenceDecoder,
    pub finish: crate::schema::FinishReason,
}

/// Follows one sequence until it finishes; the stream is dropped (cancelling the
/// sequence) as soon as the decoder saw the last token.
async fn run_to_end(
    tokenizer: Arc<TextTokenizer>,
    spec: SequenceSpec,
    mut events: SequenceStream,
    mut meter: Option<&mut RequestMeter>,
) -> Result<FinishedSequence, InferError> {
    let mut decoder = SequenceDecoder::new(tokenizer, spec);
    while let Some(event) = events.recv().await {
        let finish = match decoder.on_event(event)? {
            Progress::Pending => None,
            Progress::Token(update) => {
                if let Some(meter) = meter.as_deref_mut() {
                    meter.on_token();
                }
                update.finish
            }
            Progress::Finished(reason) => Some(reason),
        };
        if let Some(finish) = finish {
            return Ok(FinishedSequence { decoder, finish });
        }
    }
    Err(InferError::IncompleteGeneration)
}

#[cfg(test)]
#[path = "tests.rs"]
mod tests;
