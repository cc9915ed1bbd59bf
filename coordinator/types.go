package coordinator

import (
	"github.com/repronet/repronet/coordinator/catalog"
	"github.com/repronet/repronet/coordinator/core"
	"github.com/repronet/repronet/coordinator/lease"
	"github.com/repronet/repronet/coordinator/schedule"
)

// The coordinator's public types are those of the packages that own them;
// these names keep one import enough for its users.

// The life of attempts (package core).
type (
	Attempt      = core.Attempt
	AttemptState = core.AttemptState
	Assignee     = core.Assignee
	LateReport   = core.LateReport
	Decline      = core.Decline
	Output       = core.Output
	Usage        = core.Usage
	ScoreRecord  = core.ScoreRecord
	NodeRecord   = core.NodeRecord
	EvalRecord   = core.EvalRecord
	Evaluation   = core.Evaluation
	Progress     = core.Progress
	Waiting      = core.Waiting
	Stats        = core.Stats
	ReproRecord  = core.ReproRecord
	Admitted     = core.Admitted
)

// States and kinds of attempts.
const (
	StateQueued    = core.StateQueued
	StateAssigned  = core.StateAssigned
	StateReported  = core.StateReported
	StateDone      = core.StateDone
	StateFailed    = core.StateFailed
	StateCancelled = core.StateCancelled

	KindAgent       = core.KindAgent
	KindCapsuleRun  = core.KindCapsuleRun
	KindReplay      = core.KindReplay
	OutcomeDeclined = core.OutcomeDeclined
	// OutcomeUnschedulable: no node in view could run it (core/stuck.go).
	OutcomeUnschedulable = core.OutcomeUnschedulable

	UnadmittedOperator    = core.UnadmittedOperator
	MaxReplicas           = core.MaxReplicas
	MaxEvaluationAttempts = core.MaxEvaluationAttempts
	ReproSuite            = core.ReproSuite
)

// Imported things (package catalog).
type (
	Suite       = catalog.Suite
	Capsule     = catalog.Content
	Agent       = catalog.Agent
	AgentInfo   = catalog.Declared
	SuiteLimits = catalog.SuiteLimits
	SuiteOption = catalog.SuiteOption
)

// WithSuiteLimits gives a suite its own sandbox settings.
func WithSuiteLimits(l SuiteLimits) SuiteOption { return catalog.WithSuiteLimits(l) }

// Placement and leases (packages schedule and lease).
type (
	AllowancePolicy = lease.AllowancePolicy
	GroupConfig     = schedule.GroupConfig
)

// DefaultAllowancePolicy is lease.DefaultAllowancePolicy.
func DefaultAllowancePolicy() AllowancePolicy { return lease.DefaultAllowancePolicy() }

// DefaultUnschedulableAfter is the default of Config.UnschedulableAfter.
const DefaultUnschedulableAfter = core.DefaultUnschedulableAfter

// DefaultHalfLife is schedule.DefaultHalfLife.
const DefaultHalfLife = schedule.DefaultHalfLife
