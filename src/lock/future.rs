//! [`ResponseFuture`], the future of a [`LockService`](crate::LockService) call.

use std::{
    fmt,
    future::Future,
    pin::Pin,
    task::{Context, Poll, ready},
};

use bytes::Bytes;
use http::{Method, Request, Response};
use pin_project_lite::pin_project;
use tower_service::Service;

use super::body::LockedBody;
use tower_lock_core::{AfterHead, LockGuard, Outcome, Release, RequestLocker};

use crate::engine::BoxFuture;

pin_project! {
    /// Waits for the lock, then runs the inner service's future while holding it; a
    /// response with no body to send is returned once its lease has been released.
    ///
    /// Dropping it (the client went away) gives up the wait, or releases the lease.
    #[must_use = "futures do nothing unless polled"]
    pub struct ResponseFuture<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        #[pin]
        state: State<S, ReqB>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, ReqB>
    where
        S: Service<Request<ReqB>>,
    {
        Acquiring {
            acquire: BoxFuture<'static, Outcome>,
            // Taken when the outcome is known. Boxed: a request decided at once (most of
            // them) never waits here, and every future would otherwise carry its room
            // (a request is some 240 bytes), moved with it.
            waiting: Option<Box<(S, Request<ReqB>)>>,
            locker: RequestLocker,
        },
        Calling {
            #[pin]
            future: S::Future,
            held: Option<LockGuard>,
            // The request was a HEAD: its response has no body to send.
            head: bool,
        },
        // A response with no body to send waits here until its key is released
        // (`AfterHead::ReleaseFirst`).
        Releasing {
            release: Release,
            response: Option<S::Response>,
        },
        Rejected {
            response: Option<Response<Bytes>>,
        },
    }
}

impl<S, ReqB> fmt::Debug for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture").finish_non_exhaustive()
    }
}

impl<S, ReqB> ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>>,
{
    pub(crate) fn acquiring(
        acquire: BoxFuture<'static, Outcome>,
        service: S,
        request: Request<ReqB>,
        locker: RequestLocker,
    ) -> Self {
        Self {
            state: State::Acquiring {
                acquire,
                waiting: Some(Box::new((service, request))),
                locker,
            },
        }
    }

    /// The inner service's `future`; `head` if the request was a `HEAD`.
    pub(crate) fn calling(future: S::Future, head: bool, held: Option<LockGuard>) -> Self {
        Self {
            state: State::Calling { future, held, head },
        }
    }

    pub(crate) fn rejected(response: Response<Bytes>) -> Self {
        Self {
            state: State::Rejected {
                response: Some(response),
            },
        }
    }
}

impl<S, ReqB, ResB> Future for ResponseFuture<S, ReqB>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: http_body::Body,
{
    type Output = Result<Response<LockedBody<ResB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Acquiring {
                    acquire,
                    waiting,
                    locker,
                } => {
                    let outcome = ready!(acquire.as_mut().poll(cx));
                    let (mut service, mut request) =
                        *waiting.take().expect("polled after completion");
                    let held = match outcome {
                        Outcome::Locked(held) => {
                            request.extensions_mut().insert(held.info().clone());
                            Some(held)
                        }
                        Outcome::Unlocked => None,
                        Outcome::Observed(info) => {
                            request.extensions_mut().insert(info);
                            None
                        }
                        Outcome::Rejected(rejection) => {
                            let response = locker.respond(rejection, &request);
                            return Poll::Ready(Ok(response.map(LockedBody::rejection)));
                        }
                    };
                    let head = request.method() == Method::HEAD;
                    this.state.set(State::Calling {
                        future: service.call(request),
                        held,
                        head,
                    });
                }
                StateProj::Calling { future, held, head } => {
                    let response = ready!(future.poll(cx))?;
                    let Some(held) = held.take() else {
                        return Poll::Ready(Ok(response.map(|body| LockedBody::new(body, None))));
                    };
                    let body = response.body();
                    let no_body =
                        *head || body.is_end_stream() || body.size_hint().exact() == Some(0);
                    let held = match held.after_head(response.status().as_u16(), no_body) {
                        AfterHead::Released => None,
                        AfterHead::ReleaseFirst(release) => {
                            this.state.set(State::Releasing {
                                release,
                                response: Some(response),
                            });
                            continue;
                        }
                        AfterHead::HoldUntilBodyEnd(held) => Some(held),
                    };
                    return Poll::Ready(Ok(response.map(|body| LockedBody::new(body, held))));
                }
                StateProj::Releasing { release, response } => {
                    ready!(Pin::new(release).poll(cx));
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(|body| LockedBody::new(body, None))));
                }
                StateProj::Rejected { response } => {
                    let response = response.take().expect("polled after completion");
                    return Poll::Ready(Ok(response.map(LockedBody::rejection)));
                }
            }
        }
    }
}
