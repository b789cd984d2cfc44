//! [`inner_service_accessors!`]: `get_ref`, `get_mut` and `into_inner`, the accessors every
//! tower middleware service offers for the service it wraps, written once for the three.

/// The accessors of a middleware service whose wrapped service is its `inner` field, as
/// tower's own middlewares offer them.
macro_rules! inner_service_accessors {
    () => {
        /// The inner service.
        pub fn get_ref(&self) -> &S {
            &self.inner
        }

        /// The inner service, mutably.
        pub fn get_mut(&mut self) -> &mut S {
            &mut self.inner
        }

        /// Unwrap the inner service.
        pub fn into_inner(self) -> S {
            self.inner
        }
    };
}

pub(crate) use inner_service_accessors;
