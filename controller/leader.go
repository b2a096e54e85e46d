package controller

import (
	"context"
	"errors"
	"log/slog"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// LeaseName is the coordination Lease replicas elect their leader with.
const LeaseName = "onc-controller"

// Election lets replicas on one Kubernetes cluster take turns: only the
// holder of the Lease <Namespace>/onc-controller reconciles.
type Election struct {
	Config        *rest.Config
	Namespace     string
	Identity      string
	LeaseDuration time.Duration
	RenewDeadline time.Duration
	RetryPeriod   time.Duration
}

// ErrLostLeadership ends a leader that could not renew its Lease: it must
// stop writing at once, and the process exits so it restarts as a follower.
var ErrLostLeadership = errors.New("lost the leader Lease")

// RunElected waits to lead, then runs fn until ctx ends or leadership is
// lost. On a clean stop it gives the Lease up, so a standby takes over at
// once instead of after LeaseDuration.
func RunElected(ctx context.Context, e Election, fn func(ctx context.Context) error) error {
	kube, err := kubernetes.NewForConfig(e.Config)
	if err != nil {
		return err
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: LeaseName, Namespace: e.Namespace},
		Client:     kube.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: e.Identity},
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var runErr error
	led := false
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: LeaseName,
		LeaseDuration: e.LeaseDuration, RenewDeadline: e.RenewDeadline, RetryPeriod: e.RetryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				led = true
				slog.Info("leading", "lease", e.Namespace+"/"+LeaseName, "identity", e.Identity)
				runErr = fn(ctx)
				cancel()
			},
			OnStoppedLeading: func() {},
			OnNewLeader: func(id string) {
				if id != e.Identity {
					slog.Info("following", "leader", id)
				}
			},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx) // returns when ctx ends or the lease is lost
	if runErr != nil {
		return runErr
	}
	if led && parent.Err() == nil {
		return ErrLostLeadership
	}
	return nil
}
