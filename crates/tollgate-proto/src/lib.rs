#![warn(unreachable_pub)]
//! The protobuf messages and the gRPC client and server of Envoy's rate-limit service
//! (`envoy.service.ratelimit.v3.RateLimitService`), the xDS subscription to rate-limit rules
//! (see `xds.rs`) and the Rate Limit Quota Service's stream (see `rlqs.rs`); nothing else of
//! Envoy's API.
//!
//! Written by hand with `prost` derives and tonic's codegen helpers, so a build needs neither
//! protoc nor the code generated for all of Envoy's API (thousands of messages tollgate never
//! uses, which made most of a cold build's time). The module tree and the type names follow the
//! protobuf packages (`pb::envoy::service::ratelimit::v3::RateLimitRequest`, ...), as protobuf
//! code generators name them, so the wire format and the names are the ones Envoy's clients and
//! servers use.
//!
//! Field numbers and types are those of Envoy's `rls.proto`, `ratelimit.proto` (descriptors),
//! `base.proto` (`HeaderValue`), `ratelimit_unit.proto` and the well-known types used there. A
//! message decoded here skips unknown fields, as every proto3 reader may. Envoy itself, Envoy's
//! gRPC clients and grpcurl (through reflection) talk to these types in tollgate's tests.

mod client;
mod rlqs;
mod server;
mod xds;

/// Protobuf packages, one module per package segment.
pub mod pb {
    /// Envoy's packages.
    pub mod envoy {
        /// `envoy.config.*`
        pub mod config {
            /// `envoy.config.core.*`
            pub mod core {
                /// `envoy.config.core.v3`: the header type the RLS response carries, and the
                /// node an xDS client names itself with.
                pub mod v3 {
                    pub use crate::xds::Node;

                    /// A header to add (`envoy.config.core.v3.HeaderValue`).
                    #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
                    pub struct HeaderValue {
                        /// Header name.
                        #[prost(string, tag = "1")]
                        pub key: ::prost::alloc::string::String,
                        /// Header value (UTF-8).
                        #[prost(string, tag = "2")]
                        pub value: ::prost::alloc::string::String,
                        /// Header value as bytes (set instead of `value` for non-UTF-8 values).
                        #[prost(bytes = "vec", tag = "3")]
                        pub raw_value: ::prost::alloc::vec::Vec<u8>,
                    }
                }
            }
        }

        /// `envoy.type.*`
        pub mod r#type {
            /// `envoy.type.v3`: the unit of a descriptor's limit override, and the strategies a
            /// quota server assigns.
            pub mod v3 {
                pub use crate::rlqs::{rate_limit_strategy, RateLimitStrategy, TokenBucket};

                /// `envoy.type.v3.RateLimitUnit`.
                #[derive(
                    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration,
                )]
                #[repr(i32)]
                pub enum RateLimitUnit {
                    /// Not set (refused by servers).
                    Unknown = 0,
                    /// Per second.
                    Second = 1,
                    /// Per minute.
                    Minute = 2,
                    /// Per hour.
                    Hour = 3,
                    /// Per day.
                    Day = 4,
                    /// Per month.
                    Month = 5,
                    /// Per year.
                    Year = 6,
                    /// Per week.
                    Week = 7,
                }

                impl RateLimitUnit {
                    /// The value's name in the `.proto` file (`MINUTE`, ...).
                    pub fn as_str_name(&self) -> &'static str {
                        match self {
                            Self::Unknown => "UNKNOWN",
                            Self::Second => "SECOND",
                            Self::Minute => "MINUTE",
                            Self::Hour => "HOUR",
                            Self::Day => "DAY",
                            Self::Week => "WEEK",
                            Self::Month => "MONTH",
                            Self::Year => "YEAR",
                        }
                    }
                }
            }
        }

        /// `envoy.extensions.*`
        pub mod extensions {
            /// `envoy.extensions.common.*`
            pub mod common {
                /// `envoy.extensions.common.ratelimit.*`
                pub mod ratelimit {
                    /// `envoy.extensions.common.ratelimit.v3`: the descriptor.
                    pub mod v3 {
                        use crate::pb::google::protobuf::UInt64Value;

                        /// One descriptor: hierarchical entries, an optional limit override and
                        /// an optional cost.
                        #[derive(Clone, PartialEq, ::prost::Message)]
                        pub struct RateLimitDescriptor {
                            /// The entries, outermost first.
                            #[prost(message, repeated, tag = "1")]
                            pub entries: ::prost::alloc::vec::Vec<rate_limit_descriptor::Entry>,
                            /// A limit to apply instead of the configured one.
                            #[prost(message, optional, tag = "2")]
                            pub limit:
                                ::core::option::Option<rate_limit_descriptor::RateLimitOverride>,
                            /// This descriptor's cost, overriding the request's `hits_addend`.
                            #[prost(message, optional, tag = "3")]
                            pub hits_addend: ::core::option::Option<UInt64Value>,
                        }

                        /// The descriptor's nested messages.
                        pub mod rate_limit_descriptor {
                            /// One `key`/`value` entry.
                            #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
                            pub struct Entry {
                                /// Descriptor key.
                                #[prost(string, tag = "1")]
                                pub key: ::prost::alloc::string::String,
                                /// Descriptor value.
                                #[prost(string, tag = "2")]
                                pub value: ::prost::alloc::string::String,
                            }

                            /// A per-request limit replacing the configured rule.
                            #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
                            pub struct RateLimitOverride {
                                /// Requests allowed per unit.
                                #[prost(uint32, tag = "1")]
                                pub requests_per_unit: u32,
                                /// The unit (`envoy.type.v3.RateLimitUnit`).
                                #[prost(
                                    enumeration = "crate::pb::envoy::r#type::v3::RateLimitUnit",
                                    tag = "2"
                                )]
                                pub unit: i32,
                            }
                        }
                    }
                }
            }
        }

        /// `envoy.service.*`
        pub mod service {
            /// `envoy.service.discovery.*`
            pub mod discovery {
                /// `envoy.service.discovery.v3`: the aggregated discovery service's
                /// state-of-the-world messages and its client.
                pub mod v3 {
                    pub use crate::xds::{DiscoveryRequest, DiscoveryResponse};

                    /// The gRPC client.
                    pub mod aggregated_discovery_service_client {
                        pub use crate::xds::AggregatedDiscoveryServiceClient;
                    }
                }
            }

            /// `envoy.service.rate_limit_quota.*`
            pub mod rate_limit_quota {
                /// `envoy.service.rate_limit_quota.v3`: the Rate Limit Quota Service (RLQS).
                pub mod v3 {
                    pub use crate::rlqs::{
                        rate_limit_quota_response, rate_limit_quota_usage_reports, BucketId,
                        RateLimitQuotaResponse, RateLimitQuotaUsageReports,
                    };

                    /// The gRPC client.
                    pub mod rate_limit_quota_service_client {
                        pub use crate::rlqs::RateLimitQuotaServiceClient;
                    }

                    /// The gRPC server side.
                    pub mod rate_limit_quota_service_server {
                        pub use crate::rlqs::{
                            QuotaCodec, RateLimitQuotaService, RateLimitQuotaServiceServer,
                            SERVICE_NAME,
                        };
                    }
                }
            }

            /// `envoy.service.ratelimit.*`
            pub mod ratelimit {
                /// `envoy.service.ratelimit.v3`: the rate-limit service.
                pub mod v3 {
                    /// The gRPC client.
                    pub mod rate_limit_service_client {
                        pub use crate::client::*;
                    }

                    /// The gRPC server side.
                    pub mod rate_limit_service_server {
                        pub use crate::server::*;
                    }

                    use crate::pb::envoy::config::core::v3::HeaderValue;
                    use crate::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
                    use crate::pb::google::protobuf::Struct;

                    /// `ShouldRateLimit`'s request.
                    #[derive(Clone, PartialEq, ::prost::Message)]
                    pub struct RateLimitRequest {
                        /// The rules' domain.
                        #[prost(string, tag = "1")]
                        pub domain: ::prost::alloc::string::String,
                        /// The descriptors to check, each independently.
                        #[prost(message, repeated, tag = "2")]
                        pub descriptors: ::prost::alloc::vec::Vec<RateLimitDescriptor>,
                        /// The cost of the request (0 means 1).
                        #[prost(uint32, tag = "3")]
                        pub hits_addend: u32,
                    }

                    /// `ShouldRateLimit`'s response.
                    #[derive(Clone, PartialEq, ::prost::Message)]
                    pub struct RateLimitResponse {
                        /// The overall answer ([`rate_limit_response::Code`]).
                        #[prost(enumeration = "rate_limit_response::Code", tag = "1")]
                        pub overall_code: i32,
                        /// One status per descriptor, in the request's order.
                        #[prost(message, repeated, tag = "2")]
                        pub statuses:
                            ::prost::alloc::vec::Vec<rate_limit_response::DescriptorStatus>,
                        /// Headers for the client's response.
                        #[prost(message, repeated, tag = "3")]
                        pub response_headers_to_add: ::prost::alloc::vec::Vec<HeaderValue>,
                        /// Headers for the upstream request.
                        #[prost(message, repeated, tag = "4")]
                        pub request_headers_to_add: ::prost::alloc::vec::Vec<HeaderValue>,
                        /// A body for the client's response when limited.
                        #[prost(bytes = "vec", tag = "5")]
                        pub raw_body: ::prost::alloc::vec::Vec<u8>,
                        /// Metadata for the proxy's filters.
                        #[prost(message, optional, tag = "6")]
                        pub dynamic_metadata: ::core::option::Option<Struct>,
                        /// A quota assignment.
                        #[prost(message, optional, tag = "7")]
                        pub quota: ::core::option::Option<rate_limit_response::Quota>,
                    }

                    /// The response's nested messages and enums.
                    pub mod rate_limit_response {
                        use crate::pb::google::protobuf::{Duration, Timestamp};

                        /// A limit as the server applied it.
                        #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
                        pub struct RateLimit {
                            /// The rule's name.
                            #[prost(string, tag = "3")]
                            pub name: ::prost::alloc::string::String,
                            /// Requests allowed per unit.
                            #[prost(uint32, tag = "1")]
                            pub requests_per_unit: u32,
                            /// The unit ([`rate_limit::Unit`]).
                            #[prost(enumeration = "rate_limit::Unit", tag = "2")]
                            pub unit: i32,
                        }

                        /// [`RateLimit`]'s enum.
                        pub mod rate_limit {
                            /// The unit of a limit: the same values as the descriptor
                            /// override's `envoy.type.v3.RateLimitUnit`.
                            pub use crate::pb::envoy::r#type::v3::RateLimitUnit as Unit;
                        }

                        /// A quota assignment.
                        #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
                        pub struct Quota {
                            /// Requests granted.
                            #[prost(uint32, tag = "1")]
                            pub requests: u32,
                            /// The quota's identifier.
                            #[prost(string, tag = "3")]
                            pub id: ::prost::alloc::string::String,
                            /// Until when it is valid.
                            #[prost(oneof = "quota::ExpirationSpecifier", tags = "2")]
                            pub expiration_specifier:
                                ::core::option::Option<quota::ExpirationSpecifier>,
                        }

                        /// [`Quota`]'s oneof.
                        pub mod quota {
                            /// When a quota expires.
                            #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Oneof)]
                            pub enum ExpirationSpecifier {
                                /// At this time.
                                #[prost(message, tag = "2")]
                                ValidUntil(super::Timestamp),
                            }
                        }

                        /// One descriptor's answer.
                        #[derive(Clone, PartialEq, Eq, Hash, ::prost::Message)]
                        pub struct DescriptorStatus {
                            /// The answer ([`Code`]).
                            #[prost(enumeration = "Code", tag = "1")]
                            pub code: i32,
                            /// The limit that applied, if any.
                            #[prost(message, optional, tag = "2")]
                            pub current_limit: ::core::option::Option<RateLimit>,
                            /// Requests left in the current window.
                            #[prost(uint32, tag = "3")]
                            pub limit_remaining: u32,
                            /// Time until the window resets.
                            #[prost(message, optional, tag = "4")]
                            pub duration_until_reset: ::core::option::Option<Duration>,
                            /// A quota assignment.
                            #[prost(message, optional, tag = "5")]
                            pub quota: ::core::option::Option<Quota>,
                        }

                        /// An answer.
                        #[derive(
                            Clone,
                            Copy,
                            Debug,
                            PartialEq,
                            Eq,
                            Hash,
                            PartialOrd,
                            Ord,
                            ::prost::Enumeration,
                        )]
                        #[repr(i32)]
                        pub enum Code {
                            /// Not set (treated as an error by Envoy).
                            Unknown = 0,
                            /// Allowed.
                            Ok = 1,
                            /// Limited.
                            OverLimit = 2,
                        }

                        impl Code {
                            /// The value's name in the `.proto` file (`OVER_LIMIT`, ...).
                            pub fn as_str_name(&self) -> &'static str {
                                match self {
                                    Self::Unknown => "UNKNOWN",
                                    Self::Ok => "OK",
                                    Self::OverLimit => "OVER_LIMIT",
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// envoyproxy/ratelimit's packages.
    pub mod ratelimit {
        /// `ratelimit.config.*`
        pub mod config {
            /// `ratelimit.config.ratelimit.*`
            pub mod ratelimit {
                /// `ratelimit.config.ratelimit.v3`: one domain's rules as an xDS resource.
                pub mod v3 {
                    pub use crate::xds::{
                        RateLimitConfig, RateLimitDescriptor, RateLimitPolicy, RateLimitReplace,
                        RATE_LIMIT_CONFIG_TYPE,
                    };
                }
            }
        }
    }

    /// Google's packages.
    pub mod google {
        /// `google.rpc`: the error a NACK carries.
        pub mod rpc {
            pub use crate::xds::Status;
        }

        /// `google.protobuf`: the well-known types the RLS messages use.
        pub mod protobuf {
            pub use crate::rlqs::UInt32Value;
            pub use crate::xds::Any;

            /// `google.protobuf.Timestamp`.
            #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
            pub struct Timestamp {
                /// Seconds since the Unix epoch.
                #[prost(int64, tag = "1")]
                pub seconds: i64,
                /// Nanoseconds within the second.
                #[prost(int32, tag = "2")]
                pub nanos: i32,
            }

            /// `google.protobuf.Duration`.
            #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
            pub struct Duration {
                /// Whole seconds.
                #[prost(int64, tag = "1")]
                pub seconds: i64,
                /// Nanoseconds within the second.
                #[prost(int32, tag = "2")]
                pub nanos: i32,
            }

            /// `google.protobuf.UInt64Value`.
            #[derive(Clone, Copy, PartialEq, Eq, Hash, ::prost::Message)]
            pub struct UInt64Value {
                /// The value.
                #[prost(uint64, tag = "1")]
                pub value: u64,
            }

            /// `google.protobuf.Struct`: a JSON object.
            #[derive(Clone, PartialEq, ::prost::Message)]
            pub struct Struct {
                /// The object's members.
                #[prost(map = "string, message", tag = "1")]
                pub fields: ::std::collections::HashMap<::prost::alloc::string::String, Value>,
            }

            /// `google.protobuf.Value`: a JSON value.
            #[derive(Clone, PartialEq, ::prost::Message)]
            pub struct Value {
                /// The value, of one of the JSON kinds.
                #[prost(oneof = "value::Kind", tags = "1, 2, 3, 4, 5, 6")]
                pub kind: ::core::option::Option<value::Kind>,
            }

            /// [`Value`]'s oneof.
            pub mod value {
                /// A JSON value's kind.
                #[derive(Clone, PartialEq, ::prost::Oneof)]
                pub enum Kind {
                    /// `null` ([`NullValue`](super::NullValue)).
                    #[prost(enumeration = "super::NullValue", tag = "1")]
                    NullValue(i32),
                    /// A number.
                    #[prost(double, tag = "2")]
                    NumberValue(f64),
                    /// A string.
                    #[prost(string, tag = "3")]
                    StringValue(::prost::alloc::string::String),
                    /// A boolean.
                    #[prost(bool, tag = "4")]
                    BoolValue(bool),
                    /// An object.
                    #[prost(message, tag = "5")]
                    StructValue(super::Struct),
                    /// An array.
                    #[prost(message, tag = "6")]
                    ListValue(super::ListValue),
                }
            }

            /// `google.protobuf.ListValue`: a JSON array.
            #[derive(Clone, PartialEq, ::prost::Message)]
            pub struct ListValue {
                /// The array's elements.
                #[prost(message, repeated, tag = "1")]
                pub values: ::prost::alloc::vec::Vec<Value>,
            }

            /// `google.protobuf.NullValue`.
            #[derive(
                Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, ::prost::Enumeration,
            )]
            #[repr(i32)]
            pub enum NullValue {
                /// `null`.
                NullValue = 0,
            }
        }
    }
}
