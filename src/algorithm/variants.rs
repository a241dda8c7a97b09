//! The macro that makes, from the registry's one list of the algorithms,
//! everything with a variant or an arm per algorithm: [`Kind`], `ENTRIES`,
//! [`Algorithm`], [`State`], [`Snapshot`] and `with_parameters!`, the one
//! match over [`Algorithm`]'s variants that every other dispatch goes
//! through. Each algorithm's own rules are its module's, reached through
//! [`Parameters`].
//!
//! [`Kind`]: super::registry::Kind
//! [`Algorithm`]: super::Algorithm
//! [`State`]: super::State
//! [`Snapshot`]: super::Snapshot
//! [`Parameters`]: super::parameters::Parameters

/// One entry per algorithm, in the order error messages list them: its
/// doc comment, `Variant(module::Parameters)`, and its `Entry` fields but
/// its kind and Lua source (which is `<name>.lua` beside its module). The
/// first token is `$`, which the macro passes on to the `with_parameters!`
/// it defines (a macro cannot write `$` in a macro it makes otherwise).
macro_rules! algorithms {
    ($d:tt $(
        $(#[doc = $doc:literal])*
        $variant:ident($module:ident::$parameters:ident) {
            name: $name:literal,
            tag: $tag:literal,
            takes_burst: $takes_burst:literal,
            counts_denied_hits: $counts_denied_hits:literal $(,)?
        }
    )+) => {
        /// The algorithms, without their parameters, in [`ENTRIES`]' order.
        /// On the command line (the load generator's `--algorithm`) they are
        /// written `fixed-window`, `token-bucket` and so on; in files and
        /// protobuf, by [`Kind::name`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
        pub enum Kind {
            $( $(#[doc = $doc])* $variant, )+
        }

        /// Every algorithm, in the order error messages list them. The tags
        /// are storage-key tags too: a deployment's counters live under
        /// them, so an existing tag never changes.
        pub const ENTRIES: [Entry; Kind::COUNT] = [
            $(
                Entry {
                    kind: Kind::$variant,
                    name: $name,
                    tag: $tag,
                    lua: include_str!(concat!($name, ".lua")),
                    takes_burst: $takes_burst,
                    counts_denied_hits: $counts_denied_hits,
                },
            )+
        ];

        impl Kind {
            /// Every algorithm, in the order error messages list them.
            pub const ALL: [Self; [$(Self::$variant),+].len()] = [$(Self::$variant),+];
        }

        /// The algorithm and its parameters.
        #[derive(Debug, Clone, Copy, PartialEq)]
        pub enum Algorithm {
            $( $(#[doc = $doc])* $variant(super::$module::$parameters), )+
        }

        /// The in-memory state of one key, whichever algorithm owns it. A
        /// key's name includes its algorithm, so one key never holds two
        /// kinds of state.
        #[derive(Debug, Clone, PartialEq)]
        pub enum State {
            $(
                #[doc = concat!("A ", $name, " key's state.")]
                $variant(super::$module::State),
            )+
        }

        /// A key's state as plain values, the same whichever twin holds it,
        /// in each algorithm's own terms (each algorithm's Lua file says how
        /// Redis stores these).
        #[derive(Debug, Clone, PartialEq)]
        pub enum Snapshot {
            $(
                #[doc = concat!("A ", $name, " key's state.")]
                $variant(super::$module::Snapshot),
            )+
        }

        impl State {
            /// What the state holds, in the terms both twins keep it: for
            /// comparing the embedded store with Redis
            /// (tests/suite/twins.rs) and for inspection.
            pub fn snapshot(&self) -> Snapshot {
                match self {
                    $( Self::$variant(state) => Snapshot::$variant(state.snapshot()), )+
                }
            }
        }

        impl Algorithm {
            /// Which algorithm this is (see [`Kind::of`]).
            fn kind_of(&self) -> Kind {
                match self {
                    $( Self::$variant(_) => Kind::$variant, )+
                }
            }

            /// The mark of an allowed spend that left `state` (see
            /// [`Parameters::spend_mark`]); 0 for another algorithm's state.
            pub(super) fn spend_mark_on(&self, state: &State) -> u64 {
                match (self, state) {
                    $(
                        (Self::$variant(parameters), State::$variant(own)) => {
                            parameters.spend_mark(own)
                        }
                    )+
                    _ => 0,
                }
            }

            /// Gives `cost` units of a spend marked `mark` back to
            /// `state` (see [`Parameters::give_back`]): whether it did.
            pub(super) fn give_back_on(
                &self,
                state: &mut Option<State>,
                cost: u64,
                mark: u64,
            ) -> bool {
                match (self, state) {
                    $(
                        (Self::$variant(parameters), Some(State::$variant(own))) => {
                            parameters.give_back(own, cost, mark)
                        }
                    )+
                    _ => false,
                }
            }

            /// Decides `cost` on `state`, lending the algorithm its own
            /// variant of the state and putting it back after.
            pub(super) fn decide_on(
                &self,
                state: &mut Option<State>,
                now: Micros,
                cost: u64,
                spend: Spend,
            ) -> (Decision, MemoryChange) {
                match self {
                    $(
                        Self::$variant(parameters) => {
                            let mut own = match state.take() {
                                Some(State::$variant(own)) => Some(own),
                                _ => None,
                            };
                            let outcome = parameters.decide(&mut own, now, cost, spend);
                            *state = own.map(State::$variant);
                            outcome
                        }
                    )+
                }
            }
        }

        impl Kind {
            /// `rate` under this algorithm, as its module's
            /// [`Parameters::from_rate`] reads it.
            fn build_from(
                self,
                rate: Rate,
                start: WindowStart,
            ) -> Result<Algorithm, InvalidArgument> {
                match self {
                    $(
                        Self::$variant => {
                            super::$module::$parameters::from_rate(rate, start)
                                .map(Algorithm::$variant)
                        }
                    )+
                }
            }
        }

        /// `$body` with `$p` bound to `$algorithm`'s parameters, whichever
        /// algorithm it is: the one match over [`Algorithm`]'s variants,
        /// each of whose parameters is [`Parameters`].
        macro_rules! with_parameters {
            ($d algorithm:expr, $d p:ident => $d body:expr) => {
                match $d algorithm {
                    $( $crate::algorithm::Algorithm::$variant($d p) => $d body, )+
                }
            };
        }
        pub(crate) use with_parameters;
    };
}
pub(super) use algorithms;
