//! `trainlet exec`'s life of CMD: starting it as trainlet's child under a subreaper
//! ([`child`]), stopping it and its whole tree ([`stop`]), what a peer change does to it
//! and how long a restart waits ([`policy`]), the state of exec's life of it and what a
//! signal does ([`life`]), and the restart loop that ties them to the reporter
//! ([`lifecycle`]). The reporter (the agent, `src/agent`) only observes and
//! publishes; what happens to CMD is decided here.

pub mod child;
pub mod decide;
pub mod launcher;
pub mod life;
pub mod lifecycle;
pub mod output;
pub mod policy;
pub mod stop;
