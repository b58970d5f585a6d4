; active_reset.s - measure a qubit, ask the real-time host what to do, and reset it if needed.
;
; This is the active-reset example of openqlink: the measurement result leaves the QSC as an
; RPC (CALL -> UC RDMA WRITE into the host ring), a HOST_CALL handler decides (see
; firmware/active_reset.py: reset_decision), and the answer comes back as a UC SEND into the
; PPU's response mailbox, where it lands in a register that a BRANCH then tests.
;
; Timeline (DTD cycles at 250 MHz, 4 ns each; t starts at the trigger's START_TIME):
;   t=0      drive pulse, pi/2: the qubit is left in an equal superposition of |0> and |1>
;   t=64     readout window of 100 cycles on readout channel 0 -> bit in r1
;   ...      CALL stalls until r1 is valid (scoreboard), then waits for the host's answer
;   now+64   if the answer is 1: pi pulse, taking |1> back to |0>
;
; Assemble with:  qlink asm firmware/active_reset.s -o active_reset.bin

; --- channels (PLAY and MARKER channels are outputs, ACQUIRE channels are readout inputs) -----
.equ DRIVE, 0                   ; drive (DAC) channel of the qubit
.equ READOUT, 0                 ; readout (ADC) channel of the qubit

; --- timing -----------------------------------------------------------------------------------
.equ PULSE, 64                  ; drive pulse length, cycles (= envelope length, one sample/cycle)
.equ WINDOW, 400ns              ; readout integration window: 100 cycles at 250 MHz
.equ SLACK, 256ns               ; SYNC slack after the CALL: time to queue the reset pulse

; --- envelopes (allocated from sample 0 of envelope memory, computed by the assembler) --------
; One gaussian, calibrated so that amplitude 1.0 is a pi rotation; amplitude 0.5 is then pi/2
; (the rotation angle is proportional to the pulse area, i.e. to the amplitude).
.envelope gauss, gaussian, length=PULSE, sigma=16, amp=1.0

start:
        ; Prepare a superposition: pi/2 about x. The pulse starts at t (offset 0).
        play DRIVE, gauss, amp=0.5

        ; Advance the timeline past the pulse, so the readout starts when the pulse ends.
        wait PULSE

        ; Measure: integrate the I samples of READOUT over WINDOW; r1 = 1 if the sum > 0.
        ; r1 is "pending" until the window has closed: any instruction that reads r1 stalls.
        acquire READOUT, r1, window=WINDOW, threshold=0

        ; Move t to the end of the window (the core itself runs ahead of t).
        wait WINDOW

        ; Ask the real-time host. The low bit of r1 goes out as one BIT_PACKED byte, the
        ; function_id is fnv1a32("reset_decision"); the first result bytes land in r2.
        ; On a time-out or a non-zero response status the PPU stops with an error.
        call reset_decision(r1:1) -> r2

        ; r2 = 0: the qubit is already in |0>, nothing to do.
        beq r2, 0, done

        ; r2 = 1: re-anchor the timeline (the CALL took an unknown time, so t is in the past)
        ; and play the conditional pi pulse SLACK after now.
        sync SLACK
        play DRIVE, gauss, amp=1.0
        wait PULSE

done:
        ; Stop; the PPU reports DONE once the queued events have fired.
        end
